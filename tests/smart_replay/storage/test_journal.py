"""The write-ahead journal (`storage.journal`, `storage.journal_records`),
tested the way storage systems are: torn and bit-flipped files, a full disk
(a real small tmpfs), a failing fsync, and a writer killed (`SIGKILL`) at
random moments of appending, syncing, rotating and dropping, 20 rounds: what
was synced before the kill is always read back, each record once, in order.
"""

import multiprocessing
import os
import random
import signal
import subprocess
import time

import pytest

from smart_replay import errors
from smart_replay.storage import journal
from smart_replay.storage import journal_records
from smart_replay.storage import journal_segments

ROUNDS = 20
# Forked from a forkserver that has loaded the journal (no TensorFlow here).
FORKSERVER = multiprocessing.get_context('forkserver')
FORKSERVER.set_forkserver_preload(['smart_replay.storage.journal'])


def _payload(seq):
  return f'step {seq} '.encode() * (1 + seq % 7)


def _write(folder, count, **kwargs):
  kwargs.setdefault('sync', 'always')
  with journal.JournalWriter(folder, writer_id='a1', meta={'spec': 'tiny'},
                             **kwargs) as writer:
    for _ in range(count):
      writer.append(1, _payload(writer.next_seq))
      if writer.next_seq % 10 == 0:
        writer.flush()
  return journal_segments.segments(folder)['a1']


def _check_prefix(contents, at_least):
  """The records are 1..n in order with the right payloads, n >= at_least."""
  seqs = [r.seq for r in contents.records]
  assert seqs == list(range(1, len(seqs) + 1))
  assert all(r.payload == _payload(r.seq) for r in contents.records)
  assert len(seqs) >= at_least, (len(seqs), at_least)


@pytest.mark.unit
def test_frames_round_trip_and_refuse_bad_arguments():
  data = b''.join(journal_records.frame(s, 3, _payload(s)) for s in (7, 8))
  records, damage = journal_records.scan(data)
  assert damage is None
  assert [(r.seq, r.kind, r.payload) for r in records] == [
      (7, 3, _payload(7)), (8, 3, _payload(8))]
  for bad, says in [((-1, 1, b''), 'seq must be'), ((1, 256, b''), 'kind'),
                    ((1, -1, b''), 'kind')]:
    with pytest.raises(ValueError, match=says):
      journal_records.frame(*bad)


@pytest.mark.unit
def test_a_torn_or_flipped_record_ends_the_scan_there():
  good = b''.join(journal_records.frame(s, 1, _payload(s)) for s in (1, 2))
  third = journal_records.frame(3, 1, _payload(3))
  for cut in range(1, len(third)):  # Torn at every byte of the last record.
    records, damage = journal_records.scan(good + third[:cut], 'f')
    assert [r.seq for r in records] == [1, 2]
    assert damage.offset == len(good) and damage.dropped_bytes == cut
    assert 'torn' in damage.reason
  for index in range(len(third)):  # One bit flipped anywhere in it.
    flipped = bytearray(third)
    flipped[index] ^= 0x10
    records, damage = journal_records.scan(good + bytes(flipped) + good, 'f')
    assert [r.seq for r in records] == [1, 2], index
    assert damage.offset == len(good), index
    assert 'f: ' in damage.describe() and 'dropped' in damage.describe()


def test_a_writer_frames_records_as_frame_does(tmp_path):
  """The writer's inlined framing writes what `journal_records.frame` makes
  (the format journals already on disk have): a torn or flipped tail is cut
  at the last good record."""
  folder = str(tmp_path / 'journal')
  payloads = [_payload(seq) for seq in range(1, 6)] + [b'']
  with journal.JournalWriter(folder, writer_id='a1', sync='always') as writer:
    for payload in payloads:
      writer.append(2, bytearray(payload))  # Any bytes-like object.
  (_, path), = journal_segments.segments(folder)['a1']
  with open(path, 'rb') as f:
    data = f.read()
  records, damage = journal_records.scan(data)
  assert damage is None and records[0].kind == journal_records.HEADER
  expected = b''.join(journal_records.frame(seq, 2, payload)
                      for seq, payload in enumerate(payloads, 1))
  assert data.endswith(expected)
  head = len(data) - len(expected)
  last = len(journal_records.frame(6, 2, b''))
  for cut in (1, last - 1):
    records, damage = journal_records.scan(data[:-cut])
    assert records[-1].seq == 5 and damage.offset == len(data) - last
  flipped = bytearray(data)
  flipped[head + journal_records.FRAME_BYTES + 3] ^= 0x04  # Record 1's.
  records, damage = journal_records.scan(bytes(flipped))
  assert len(records) == 1 and damage.offset == head
  assert 'checksum mismatch in record 1' in damage.reason


def test_every_second_writes_within_a_fraction_of_a_second_unasked(tmp_path):
  """'every_second': the background thread hands what is pending to the OS
  about every 0.2 s and fsyncs about every second, with no further append,
  flush or sync."""
  folder = str(tmp_path / 'journal')
  writer = journal.JournalWriter(folder, writer_id='a1', sync='every_second')
  try:
    for _ in range(3):
      writer.append(1, _payload(writer.next_seq))
    began = time.monotonic()
    while not journal_segments.read(folder, 'a1').records:
      assert time.monotonic() - began < 5, 'never written'
      time.sleep(0.02)
    assert [r.seq for r in journal_segments.read(folder, 'a1').records] == [
        1, 2, 3]
    while writer.synced_seq < 3:
      assert time.monotonic() - began < 10, 'never synced'
      time.sleep(0.05)
  finally:
    writer.close()


def test_records_come_back_in_order_across_segments(tmp_path):
  folder = str(tmp_path / 'journal')
  paths = _write(folder, 3000, segment_bytes=4096, sync='every_second')
  assert len(paths) > 1
  contents = journal_segments.read(folder, 'a1')
  _check_prefix(contents, 3000)
  assert contents.meta == {'spec': 'tiny'} and contents.damage == []
  assert all(os.stat(p).st_mode & 0o777 == 0o600 for _, p in paths)


@pytest.mark.parametrize('bad', ['gap', 'flip', 'torn'])
def test_a_damaged_file_is_cut_at_its_last_good_record(tmp_path, bad, caplog):
  folder = str(tmp_path / 'journal')
  paths = _write(folder, 400, segment_bytes=4096)
  first, path = paths[1]
  if bad == 'gap':  # A whole segment missing: the records after it too.
    os.unlink(path)
    expected = first - 1
  else:
    with open(path, 'r+b') as f:
      data = f.read()
      f.seek(0)
      f.truncate()
      header_end = data.index(journal_records.MAGIC, 4)
      if bad == 'flip':  # The 3rd record of the segment.
        start = header_end
        for _ in range(2):
          start = data.index(journal_records.MAGIC, start + 4)
        data = data[:start + 30] + bytes([data[start + 30] ^ 1]) + data[
            start + 31:]
        expected = first + 1
      else:
        data = data[:-5]  # Torn: its last record.
        expected = paths[2][0] - 2
      f.write(data)
  contents = journal_segments.read(folder, 'a1')
  _check_prefix(contents, expected)
  assert contents.last_seq == expected
  assert contents.damage and str(path if bad != 'gap' else '') in (
      contents.damage[0].describe())
  assert 'Journal of writer a1' in caplog.text
  # Reading again gives the same, each record once.
  assert journal_segments.read(folder, 'a1').records == contents.records


def test_records_written_again_after_a_failed_fsync_are_taken_once(
    tmp_path, monkeypatch):
  folder = str(tmp_path / 'journal')
  writer = journal.JournalWriter(folder, writer_id='a1', sync='always')
  for _ in range(10):
    writer.append(1, _payload(writer.next_seq))
  writer.flush()
  for _ in range(5):
    writer.append(1, _payload(writer.next_seq))
  real_sync, failed = journal._sync_data, []  # pylint: disable=protected-access

  def sync_failing_once(fd):
    if not failed:
      failed.append(fd)
      raise OSError(5, 'Input/output error')
    real_sync(fd)
  monkeypatch.setattr(journal, '_sync_data', sync_failing_once)
  writer.flush()  # 11..15 written, fsync failed, written again elsewhere.
  monkeypatch.setattr(journal, '_sync_data', real_sync)
  assert writer.stats()['failures'] == 1
  assert writer.synced_seq == 15
  writer.append(1, _payload(16))
  writer.close()
  assert len(journal_segments.segments(folder)['a1']) == 2
  _check_prefix(journal_segments.read(folder, 'a1'), 16)


def test_rotate_and_drop_before_free_what_a_checkpoint_covers(tmp_path):
  folder = str(tmp_path / 'journal')
  with journal.JournalWriter(folder, writer_id='a1', sync='always') as writer:
    for round_ in range(3):
      for _ in range(100):
        writer.append(1, _payload(writer.next_seq))
      writer.rotate()  # Segments start at 1, 101, 201, 301.
    firsts = lambda: [f for f, _ in journal_segments.segments(folder)['a1']]
    assert firsts() == [1, 101, 201, 301]
    assert writer.drop_before(150) > 0  # 1..100 only: 101..200 has 150.
    assert firsts() == [101, 201, 301]
    assert writer.drop_before(10_000) > 0  # Never the open segment.
    assert firsts() == [301]
    del round_
  assert journal_segments.read(folder, 'a1').records == []


@pytest.fixture
def small_disk(tmp_path):
  """A 1 MB tmpfs (CI runs as root); skipped where mounting is not allowed."""
  mount = tmp_path / 'disk'
  mount.mkdir()
  done = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs',
                         str(mount)], capture_output=True, text=True,
                        check=False)
  if done.returncode != 0:
    pytest.skip(f'cannot mount a tmpfs here (needs root): {done.stderr}')
  yield mount
  subprocess.run(['umount', '-l', str(mount)], check=False)


def test_a_full_disk_raises_keeps_everything_and_goes_on_once_freed(
    small_disk):
  folder = str(small_disk / 'journal')
  ballast = small_disk / 'ballast'
  writer = journal.JournalWriter(folder, writer_id='a1', sync='always')
  ballast.write_bytes(b'\0' * 900_000)
  refused = None
  for _ in range(20_000):
    try:
      writer.append(1, _payload(writer.next_seq))
      writer.flush()
    except errors.JournalWriteError as e:
      refused = e
      break
  assert refused is not None, 'the disk never filled'
  assert 'No space left on device' in str(refused)
  assert 'kept in memory' in str(refused)
  appended = writer.next_seq - 1
  with pytest.raises(errors.JournalWriteError):  # Still full: refused.
    writer.check()
  with pytest.raises(errors.JournalWriteError):
    writer.append(1, b'refused')
  assert writer.next_seq - 1 == appended  # Nothing appended meanwhile.
  # What reached the file so far is whole records only.
  _check_prefix(journal_segments.read(folder, 'a1'), 1)
  ballast.unlink()
  writer.check()  # Writes what the failed write left: it takes records.
  assert writer.check() is None
  writer.append(1, _payload(writer.next_seq))
  writer.close()
  with pytest.raises(errors.ManagerStateError):
    writer.check()
  _check_prefix(journal_segments.read(folder, 'a1'), appended + 1)


def test_bad_arguments_name_the_value(tmp_path):
  folder = str(tmp_path / 'journal')
  for kwargs, says in [({'writer_id': 'A1'}, 'writer_id must be'),
                       ({'writer_id': 'a1', 'sync': 'sometimes'},
                        "journal sync must be one of .*'sometimes'"),
                       ({'writer_id': 'a1', 'first_seq': 0}, 'first_seq'),
                       ({'writer_id': 'a1', 'segment_bytes': 10},
                        'segment_bytes')]:
    with pytest.raises(ValueError, match=says):
      journal.JournalWriter(folder, **kwargs)
  os.symlink(str(tmp_path), str(tmp_path / 'link'))
  with pytest.raises(errors.UnsafeBufferDirError):
    journal.JournalWriter(str(tmp_path / 'link'), writer_id='a1')


# ------------------------------------------------------------ kill -9


def _append_until_killed(folder, sync, segment_bytes, conn):
  """Appends, flushes, rotates and drops at random; reports each synced
  sequence number; runs until killed."""
  rng = random.Random(os.getpid())
  writer = journal.JournalWriter(folder, writer_id='a1', sync=sync,
                                 segment_bytes=segment_bytes,
                                 sync_interval_s=0.05)
  while True:
    for _ in range(rng.randrange(1, 200)):
      writer.append(1, _payload(writer.next_seq))
    step = rng.random()
    if step < 0.6:
      writer.flush()
    elif step < 0.8:
      writer.rotate()
    else:
      writer.drop_before(max(1, writer.next_seq - 500))
    conn.send(writer.synced_seq)


@pytest.mark.parametrize('sync', ['always', 'every_second'])
def test_a_kill_at_random_moments_keeps_every_synced_record(tmp_path, sync):
  """20 rounds: a writer killed at a random moment of appending, flushing,
  rotating or dropping; each round a new writer folder. What it reported
  synced is read back (from the oldest segment it kept), in order, once."""
  rng = random.Random(41)
  for round_ in range(ROUNDS):
    folder = str(tmp_path / f'journal{round_}')
    parent, child = FORKSERVER.Pipe()
    process = FORKSERVER.Process(target=_append_until_killed,
                            args=(folder, sync, 8192, child))
    process.start()
    child.close()
    synced = 0
    assert parent.poll(120), 'the writer never reported'
    deadline = time.monotonic() + rng.uniform(0.05, 0.5)
    while time.monotonic() < deadline:
      if parent.poll(0.01):
        synced = parent.recv()
    process.kill()
    process.join(60)
    assert process.exitcode == -signal.SIGKILL
    contents = journal_segments.read(folder, 'a1')
    seqs = [r.seq for r in contents.records]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True
    assert all(r.payload == _payload(r.seq) for r in contents.records)
    assert contents.last_seq >= synced, (round_, contents.last_seq, synced)
    # Only the tail may be damaged: a torn last record, never a gap.
    assert all('missing' not in d.reason for d in contents.damage)
