"""Faults degrade, never kill: full and read-only disks on a real small tmpfs.

A failed save raises one `CheckpointWriteError` naming the path and the cause,
leaves nothing behind, keeps the earlier checkpoints intact and the buffer
serving; the next save succeeds once the disk is usable again. The standalone
server logs the failure, shows it in its status line and retries.
"""

import concurrent.futures
import contextlib
import errno
import os
import subprocess

import pytest

import smart_replay
from smart_replay.remote import replay_server as serve_lib
from smart_replay.server import local_server as server_lib
from smart_replay.storage import checkpoint_folders as checkpoints
from smart_replay.storage import store as checkpoint_store
from tests.smart_replay.storage import durability_worker as worker


@pytest.fixture
def small_disk(tmp_path):
  """A 16 MB tmpfs (CI runs as root); skipped where mounting is not allowed."""
  mount = tmp_path / 'disk'
  mount.mkdir()
  result = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=16m', 'tmpfs',
                           str(mount)], capture_output=True, text=True,
                          check=False)
  if result.returncode:
    pytest.skip(f'cannot mount a tmpfs here (needs root): {result.stderr}')
  yield mount
  subprocess.run(['umount', '-l', str(mount)], check=False)


def _fill(disk):
  """Fills `disk` completely; returns the filler file's path."""
  filler = os.path.join(disk, 'filler')
  with open(filler, 'wb', buffering=0) as f:
    try:
      while True:
        f.write(b'\0' * (1 << 16))
    except OSError as e:
      assert e.errno == errno.ENOSPC
  return filler


@contextlib.contextmanager
def _read_only(folder):
  """Makes `folder` read-only (a read-only bind mount over itself)."""
  subprocess.run(['mount', '--bind', folder, folder], check=True)
  try:
    subprocess.run(['mount', '-o', 'remount,bind,ro', folder], check=True)
    yield
  finally:
    subprocess.run(['umount', folder], check=True)


def _nothing_left_behind(buffer_dir):
  assert os.listdir(os.path.join(buffer_dir, checkpoints.REVERB_DIR)) == []
  folder = os.path.join(buffer_dir, checkpoints.CHECKPOINTS_DIR)
  assert all(checkpoints.checkpoint_number(n)
             for n in (os.listdir(folder) if os.path.isdir(folder) else []))


def test_full_then_read_only_disk_fail_the_save_and_lose_nothing(small_disk):
  buffer_dir = str(small_disk / 'buffer')
  manager, _, observer = worker.new_buffer_with_round(buffer_dir)
  first = manager.checkpoint(extra={'round': 0})
  filler = _fill(small_disk)
  for step in worker.round_steps(1):
    observer(step)
  with pytest.raises(smart_replay.CheckpointWriteError) as e:
    manager.checkpoint(extra={'round': 1})
  assert buffer_dir in str(e.value)
  assert isinstance(e.value, OSError)
  _nothing_left_behind(buffer_dir)
  assert manager.existing_checkpoints() == [first]
  assert checkpoints.verify(first)['extra'] == {'round': 0}
  # The buffer keeps serving: it holds both rounds and samples.
  assert manager.num_frames() == 16
  trajectory, _ = next(iter(manager.get_dataset(batch_size=4)))
  assert trajectory.observation.shape == (4, 2, 1)
  # Reverb "writes" empty files on a full disk; a snapshot refuses them.
  with pytest.raises(smart_replay.CheckpointWriteError, match='incomplete'):
    manager.stats(times_sampled=True)
  os.remove(filler)
  with _read_only(buffer_dir):
    with pytest.raises(smart_replay.CheckpointWriteError,
                       match='Read-only file system'):
      manager.checkpoint(extra={'round': 1})
  for step in worker.round_steps(2):
    observer(step)
  newest = manager.checkpoint(extra={'round': 2})  # Space is back.
  manager.close()
  _nothing_left_behind(buffer_dir)
  again = worker.make_manager(buffer_dir)
  again.load_replay_buffer()
  assert again.loaded_checkpoint == newest
  assert worker.stored_first_steps(again) == worker.expected_first_steps(
      [0, 1, 2])
  again.close()


@pytest.mark.parametrize('step,code', [
    ('moved', errno.ENOSPC), ('hashed', errno.EIO),
    ('manifest_written', errno.EROFS)])
def test_a_failing_commit_step_removes_the_save(tmp_path, monkeypatch, step,
                                                code):
  def fail(reached):
    if reached == step:
      raise OSError(code, os.strerror(code))
  buffer_dir = str(tmp_path / 'buffer')
  manager = worker.make_manager(buffer_dir)
  manager.create_replay_buffer()
  first = manager.checkpoint()
  monkeypatch.setattr(checkpoint_store, '_fault_point', fail)
  with pytest.raises(smart_replay.CheckpointWriteError,
                     match=f'{os.strerror(code)}.*errno {code}'):
    manager.checkpoint()
  _nothing_left_behind(buffer_dir)
  assert manager.existing_checkpoints() == [first]
  monkeypatch.undo()
  assert checkpoints.checkpoint_number(manager.checkpoint()) == 2
  manager.close()


def test_server_survives_a_full_disk_and_retries(small_disk):
  buffer_dir = str(small_disk / 'buffer')
  server = serve_lib.ReplayServer(
      worker.make_manager(buffer_dir), checkpoint_every_inserts=1,
      checkpoint_retry_s=0.001, log_every_s=3600)
  server.start()
  try:
    observer = server.manager.observer
    filler = _fill(small_disk)
    for step in worker.round_steps(0):
      observer(step)
    observer.flush()
    assert server.poll() is None  # Failed, logged, not raised.
    status = server.status_line(server.manager.stats(), 0.0)
    assert 'CHECKPOINTS FAILING' in status and 'bytes free' in status
    _nothing_left_behind(buffer_dir)
    assert server.manager.num_frames() == 8  # Still serving.
    os.remove(filler)
    path = server.poll()  # The retry succeeds once space is back.
    assert checkpoints.verify(path)['counts']['tables']['experience'][
        'items'] == 8
    assert 'FAILING' not in server.status_line(server.manager.stats(), 0.0)
  finally:
    server.close(final_checkpoint=False)


def test_insert_schedule_tail_is_saved_within_max_unsaved_s(tmp_path):
  server = serve_lib.ReplayServer(
      worker.make_manager(str(tmp_path / 'buffer')),
      checkpoint_every_inserts=1000, max_unsaved_s=0.001, log_every_s=3600)
  server.start()
  try:
    observer = server.manager.observer
    for step in worker.round_steps(0):
      observer(step)
    observer.flush()
    assert server.poll() is None  # The tail is first seen unsaved here.
    path = None
    while path is None:  # Due once the tail is max_unsaved_s old.
      path = server.poll()
    assert checkpoints.verify(path)['counts']['tables']['experience'][
        'items'] == 8
  finally:
    server.close(final_checkpoint=False)


@pytest.mark.parametrize('raised', [
    IndexError('chunks.tfrecord; No space left on device'),
    RuntimeError('Internal: write failed'), OSError(errno.EIO, 'I/O error')])
def test_whatever_reverb_raises_becomes_one_error(raised):
  def reverb_checkpoint():
    raise raised
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    with pytest.raises(smart_replay.CheckpointWriteError) as e:
      server_lib.wait_for_checkpoint(pool.submit(reverb_checkpoint),
                                     timeout_s=10, where='/buffer/.reverb')
  assert str(e.value) == ('Reverb failed to write a checkpoint to '
                          f'/buffer/.reverb: {type(raised).__name__}: {raised}')
  assert e.value.__cause__ is raised
