"""A write-ahead journal's writer: one writer's records, appended and synced.

A `JournalWriter` appends records (`journal_records`) with its own sequence
numbers, 1, 2, 3, ..., to segment files (`journal_segments`: named by writer
and first sequence number, mode 0600, never through a link), each opening
with a header record that holds the writer's `meta`. How often it makes
them durable is its sync policy, like Redis's `appendfsync`:

* 'always': `flush()` returns once everything appended is written and
  fsynced (one fsync per flush, however many records: a group commit);
* 'every_second' (the default): a background thread hands what is
  pending to the OS every 0.2 s and fsyncs once a second (appends frame
  records in memory and wait for no disk, unless 16 MiB are pending or a
  write failed); a process kill loses at most the last 0.2 s or so, a
  machine crash about a second plus an fsync;
* 'off': written to the operating system when 1 MiB is pending and at
  `flush()`, never fsynced (a process kill loses at most what was not
  flushed; a machine crash, what the OS had not written back).

Nothing appended is dropped on a failure. A failed write (a full disk) is
cut back to the last whole record, the records stay in memory, and every
append raises `JournalWriteError` until a write succeeds again (the next
append, flush or background sync retries). A failed fsync may have lost
written pages (the kernel drops them), so the records since the last good
fsync are written again into a new segment: readers take each sequence
number once. An fsync runs on a duplicate of the segment's descriptor
without the writers' I/O lock, so that appends and writes go on while the
disk is slow. `rotate()` starts a new segment (at a checkpoint), so that
`drop_before(seq)` can delete the segments a checkpoint covers.
"""

import json
import os
import threading
import time
import zlib
from typing import Any, Dict, Mapping, Optional

from absl import logging

from smart_replay import errors
from smart_replay.config import options
from smart_replay.storage import durable
from smart_replay.storage import journal_records
from smart_replay.storage import journal_segments as segments_lib
from smart_replay.storage import ownership

SYNC_POLICIES = options.JOURNAL_SYNC
DEFAULT_SYNC = 'every_second'
# A segment is closed and a new one started past this size.
SEGMENT_BYTES = 64 << 20
# Appended bytes held in memory before they are written to the OS.
_WRITE_AT = 1 << 20
# 'every_second': how often the background thread hands the pending records
# to the OS (a process kill loses no more).
_WRITE_AFTER_S = 0.2
# A record's frame (`journal_records`), packed in two parts on the hot path:
# what goes before the checksummed bytes, and those bytes' numbering.
_PREFIX = journal_records.PREFIX
_NUMBERED = journal_records.NUMBERED
_MAGIC = journal_records.MAGIC
_crc32 = zlib.crc32
# What `check` is while the journal takes records: called with no arguments,
# it returns None, in C (a Python call costs about 1% of an observer's
# low-dimensional step, which calls `check` every time).
_NOTHING = type(None)


def check_sync(sync: Any) -> str:
  """Checks a sync policy; returns it.

  Raises:
    ValueError: if it is not one of `SYNC_POLICIES`; names it.
  """
  if sync not in SYNC_POLICIES:
    raise ValueError(f'journal sync must be one of {SYNC_POLICIES}, got '
                     f'{sync!r}.')
  return sync


class JournalWriter:
  """Appends one writer's records to its segments (see the module doc).

  Args:
    folder: the journal's folder (made, mode 0700, if missing; the folder
      holding it must exist).
    writer_id: the writer's id (1 to 32 lower-case hex digits).
    meta: what every segment's header holds (JSON), e.g. what the records
      encode.
    sync: 'always', 'every_second' or 'off'.
    first_seq: the sequence number of the first record.
    segment_bytes: a new segment starts past this size.
    sync_interval_s: the background sync's period ('every_second').

  Attributes:
    next_seq: the sequence number the next record gets (read it; an
      attribute, not a property, since an observer reads it at every step).

  Raises:
    ValueError: if an argument is bad; names it.
    UnsafeBufferDirError: if `folder` is a link.
    JournalWriteError: if the first segment cannot be made.
  """

  def __init__(self, folder: str, *, writer_id: str,
               meta: Optional[Mapping[str, Any]] = None,
               sync: str = DEFAULT_SYNC, first_seq: int = 1,
               segment_bytes: int = SEGMENT_BYTES,
               sync_interval_s: float = 1.0):
    segments_lib.check_writer_id(writer_id)
    check_sync(sync)
    if isinstance(first_seq, bool) or not isinstance(first_seq, int) or (
        first_seq < 1):
      raise ValueError(f'first_seq must be an int >= 1, got {first_seq!r}.')
    if not isinstance(segment_bytes, int) or segment_bytes < 4096:
      raise ValueError('segment_bytes must be an int >= 4096, got '
                       f'{segment_bytes!r}.')
    if not sync_interval_s > 0:
      raise ValueError('sync_interval_s must be positive, got '
                       f'{sync_interval_s!r}.')
    self.folder = ownership.private_dir(folder)
    self.writer_id = writer_id
    self.sync_policy = sync
    self._meta = json.loads(json.dumps(dict(meta or {})))  # JSON, a copy.
    self._segment_bytes = segment_bytes
    # Appends hold only `_lock`, so that a write or fsync (under `_io`,
    # taken first when both are) never holds them up.
    self._lock = threading.Lock()
    self._io = threading.RLock()
    self._write_at = _WRITE_AT * (16 if sync == 'every_second' else 1)
    self.next_seq = first_seq
    self._pending = bytearray()  # Appended, not yet written to the OS.
    self._pending_first = first_seq
    self._error: Optional[errors.JournalWriteError] = None
    self._closed = False
    self._healthy(True)
    # Under `_io`: the open segment, and what was written to it since the
    # last fsync (to write again if one fails).
    self._fd = -1
    self._path = ''
    self._offset = 0  # Bytes of whole records in the open segment.
    self._unsynced = bytearray()
    self._unsynced_first = first_seq
    self._unsynced_generation = 0  # Counts trims of `_unsynced`.
    self._written_seq = first_seq - 1  # The last record written to the OS.
    self._synced_seq = first_seq - 1
    self.last_sync_unix: Optional[float] = None
    self.failures = 0
    # `set_alarm`: the event set once a record numbered `_alarm_at` or more
    # is appended.
    self._alarm_at = float('inf')
    self._alarm: Optional[threading.Event] = None
    with self._io:
      self._open_segment(first_seq)
    self._stop = threading.Event()
    self._thread = None
    if sync == 'every_second':
      self._thread = threading.Thread(
          target=self._sync_loop, args=(sync_interval_s,), daemon=True,
          name=f'journal-sync-{writer_id}')
      self._thread.start()

  closed = property(lambda self: self._closed,
                    doc='Whether `close()` was called.')
  synced_seq = property(
      lambda self: self._synced_seq,
      doc="The highest sequence number fsynced ('off': written to the OS).")
  past_alarm = property(
      lambda self: self.next_seq > self._alarm_at,
      doc='Whether a record has reached the `set_alarm` sequence number.')

  def append(self, kind: int, payload: bytes) -> int:
    """Appends one record; returns its sequence number.

    It reaches the file at the next flush, sync or background sync (or
    once enough is pending: 1 MiB; 16 MiB with 'every_second').

    Args:
      kind: what it holds, 1..255.
      payload: its bytes.

    Raises:
      ValueError: if `kind` is 0 (a header) or out of range.
      ManagerStateError: if the writer is closed.
      JournalWriteError: if an earlier write failed and writing again fails
        too; nothing is appended.
    """
    if not 0 < kind < 256:
      raise ValueError(f'kind must be in 1..255 (0 is a segment header), got '
                       f'{kind!r}.')
    if self._error is not None or len(self._pending) >= self._write_at:
      self._drain(fsync=False)
    # The frame as `journal_records.frame` makes it, inlined (and the lock
    # taken without `with`, which costs twice as much): an observer appends
    # a record per step.
    lock = self._lock
    lock.acquire()
    try:
      if self._closed:
        self._check_open()
      seq = self.next_seq
      numbered = _NUMBERED.pack(seq, kind)
      pending = self._pending
      pending += _PREFIX.pack(_MAGIC, len(payload),
                              _crc32(payload, _crc32(numbered)))
      pending += numbered
      pending += payload
      self.next_seq = seq + 1
    finally:
      lock.release()
    if seq >= self._alarm_at:
      self._alarm.set()
    return seq

  def set_alarm(self, seq: int, event: threading.Event) -> None:
    """Sets `event` once a record numbered `seq` or more is appended (at
    once if one was); replaces the previous alarm.

    Args:
      seq: the sequence number.
      event: what to set.
    """
    with self._lock:
      self._alarm_at, self._alarm = seq, event
      if self.next_seq > seq:
        event.set()

  def check(self) -> None:
    """Raises if the journal cannot take records: an earlier write failed
    and writing it again fails too (call it before doing what a record will
    describe).

    Raises:
      ManagerStateError: if the writer is closed.
      JournalWriteError: as `flush`.
    """
    if self._error is None and not self._closed:
      return  # The common case, without a lock.
    self._check_open()
    self._drain(fsync=False)

  def flush(self) -> None:
    """Writes what was appended to the OS; with 'always', fsyncs it too.

    Raises:
      JournalWriteError: if writing or syncing fails (nothing is lost: it
        is tried again at the next call).
    """
    if not self._closed:
      self._drain(fsync=self.sync_policy == 'always')

  def sync(self) -> None:
    """Writes and fsyncs what was appended ('off': writes it only).

    Raises:
      JournalWriteError: as `flush`.
    """
    if not self._closed:
      self._drain(fsync=self.sync_policy != 'off')

  def rotate(self) -> None:
    """Syncs, then starts a new segment after the last record written (so
    that `drop_before` can later delete the ones before).

    Raises:
      JournalWriteError: as `flush`.
    """
    self._check_open()
    with self._io:
      self._drain(fsync=self.sync_policy != 'off')
      if self._offset > self._header_bytes:
        self._open_segment(self._written_seq + 1)

  # What a client's observer needs to send its calls again after a restart
  # of its server (`resending.Resender.resend`), as `retained.
  # RetainedRecords` offers it: a journal drops no record for memory.
  dropped = ()

  @property
  def dropped_through(self) -> int:
    """Every record up to here was dropped (its segments deleted)."""
    with self._io:
      paths = segments_lib.segments(self.folder).get(self.writer_id, [])
      return (paths[0][0] if paths else self.next_seq) - 1

  def contents(self) -> segments_lib.JournalContents:
    """The records this journal holds, read back (after writing what was
    appended to the OS)."""
    self.flush()
    contents = segments_lib.read(self.folder, self.writer_id)
    contents.meta = contents.meta or self._meta
    return contents

  def drop_through(self, seq: int) -> int:
    """Deletes the segments whose records all come up to `seq` (see
    `drop_before`); returns the bytes freed."""
    return self.drop_before(seq + 1)

  def drop_before(self, seq: int) -> int:
    """Deletes this writer's segments whose records all come before `seq`
    (never the open one).

    Args:
      seq: the first sequence number to keep.

    Returns:
      The bytes freed.
    """
    with self._io:
      paths = segments_lib.segments(self.folder).get(self.writer_id, [])
      freed = 0
      for (_, path), (next_first, _) in zip(paths, paths[1:]):
        if next_first <= seq and path != self._path:
          freed += segments_lib.remove(path)
      if freed:
        durable.fsync_dir(self.folder)
      return freed

  def stats(self) -> Dict[str, Any]:
    """What the journal holds and its last sync.

    Returns:
      `{'bytes': on disk, 'segments': count, 'pending_bytes': appended but
      not yet written, 'next_seq', 'synced_seq', 'last_sync_unix',
      'failures': failed writes or syncs, 'sync': the policy}`.
    """
    with self._io:
      paths = segments_lib.segments(self.folder).get(self.writer_id, [])
      size = 0
      for _, path in paths:
        try:
          size += os.lstat(path).st_size
        except FileNotFoundError:
          pass
      return {'bytes': size, 'segments': len(paths),
              'pending_bytes': len(self._pending),
              'next_seq': self.next_seq, 'synced_seq': self._synced_seq,
              'last_sync_unix': self.last_sync_unix,
              'failures': self.failures, 'sync': self.sync_policy}

  def close(self) -> None:
    """Syncs (per the policy) and closes; safe to call more than once.

    Raises:
      JournalWriteError: if the last write or sync fails (the file is
        closed anyway; what was synced before stays).
    """
    if self._thread is not None:
      self._stop.set()
      self._thread.join()
      self._thread = None
    with self._io:
      if self._closed:
        return
      try:
        self._drain(fsync=self.sync_policy != 'off')
      finally:
        with self._lock:
          self._closed = True
        self._healthy(False)
        os.close(self._fd)

  def __enter__(self) -> 'JournalWriter':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  # ------------------------------------------------------------ internals

  def _healthy(self, healthy: bool) -> None:
    """While the journal takes records, `check` is `_NOTHING`; else the
    method, which raises (or writes what a failed write left)."""
    if healthy and not self._closed:
      self.check = _NOTHING
    else:
      self.__dict__.pop('check', None)

  def _check_open(self) -> None:
    if self._closed:
      raise errors.ManagerStateError(
          f'the journal of writer {self.writer_id} is closed.')

  def _sync_loop(self, interval_s: float) -> None:
    """'every_second': writes what is pending every `_WRITE_AFTER_S`,
    and fsyncs every `interval_s`."""
    sync_at = time.monotonic() + interval_s
    while not self._stop.wait(max(0.0, min(_WRITE_AFTER_S,
                                           sync_at - time.monotonic()))):
      try:
        if time.monotonic() >= sync_at:
          sync_at = time.monotonic() + interval_s
          self.sync()
        elif self._pending:
          self._drain(fsync=False)
      except errors.JournalWriteError as e:
        logging.error('%s', e)  # Raised to the writer at its next append.

  def _open_segment(self, first_seq: int) -> None:
    """Closes the open segment (if any) and starts one at `first_seq`
    (under `_io`)."""
    path = os.path.join(self.folder,
                        segments_lib.segment_name(self.writer_id, first_seq))
    try:
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                   os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
      raise self._failed(f'cannot start segment {path}', e) from e
    header = journal_records.frame(
        first_seq, journal_records.HEADER, json.dumps(
            {'format': segments_lib.FORMAT, 'writer_id': self.writer_id,
             'first_seq': first_seq, 'created_unix': time.time(),
             'meta': self._meta}).encode())
    try:
      _write_all(fd, header)
      os.fsync(fd)
      durable.fsync_dir(self.folder)
    except OSError as e:
      os.close(fd)
      segments_lib.remove(path)
      raise self._failed(f'cannot start segment {path}', e) from e
    if self._fd >= 0:
      os.close(self._fd)
    self._fd, self._path = fd, path
    self._offset = self._header_bytes = len(header)

  def _drain(self, *, fsync: bool) -> None:
    """Writes the pending records to the open segment (and fsyncs it, if
    `fsync`), holding `_io` but not the appends' lock; a failed write is cut
    back to the last whole record, its records go back in front of the
    pending ones, and it raises."""
    with self._io:
      with self._lock:
        batch, first = self._pending, self._pending_first
        upto = self.next_seq - 1
        self._pending = bytearray()
        self._pending_first = self.next_seq
      if batch:
        try:
          _write_all(self._fd, batch)
        except OSError as e:
          try:
            os.ftruncate(self._fd, self._offset)
            os.lseek(self._fd, self._offset, os.SEEK_SET)
          except OSError:
            pass
          with self._lock:
            self._pending = batch + self._pending
            self._pending_first = first
          raise self._failed(f'cannot write {len(batch):,} bytes to '
                             f'{self._path}', e) from e
        self._offset += len(batch)
        self._written_seq = upto
        segments_lib.fault_point('written')
        if self.sync_policy == 'off':
          self._synced_seq = upto
        else:
          if not self._unsynced:
            self._unsynced_first = first
          self._unsynced += batch
      self._error = None
      self._healthy(True)
      if self._offset >= self._segment_bytes:  # Synced before it closes.
        if self.sync_policy != 'off':
          self._fsync()
        self._open_segment(self._written_seq + 1)
    if fsync and self.sync_policy != 'off':
      self._fsync()

  def _fsync(self) -> None:
    """Fsyncs what was written to the open segment, on a duplicate of its
    descriptor and without `_io` (unless the caller holds it: a rotation);
    if that fails, writes the records since the last good fsync into a new
    segment and fsyncs that."""
    with self._io:
      if not self._unsynced:
        return
      fd, path = os.dup(self._fd), self._path
      count, upto = len(self._unsynced), self._written_seq
      generation = self._unsynced_generation
    failure = None
    try:
      _sync_data(fd)
    except OSError as e:
      failure = e
    finally:
      os.close(fd)
    with self._io:
      if path != self._path:
        return  # A rotation fsynced that segment before it started another.
      if failure is None:
        if generation == self._unsynced_generation:  # Else another sync
          del self._unsynced[:count]  # trimmed it, as far as it synced.
          self._unsynced_first = upto + 1
          self._unsynced_generation += 1
        self._synced_seq = max(self._synced_seq, upto)
        self.last_sync_unix = time.time()
        segments_lib.fault_point('synced')
        return
      e = failure
      self.failures += 1
      logging.error('fsync of %s failed (%s): writing the records since the '
                    'last good fsync again, into a new segment.', self._path,
                    e)
      again, first = self._unsynced, self._unsynced_first
      try:
        if first == self._segment_first():  # Nothing in it was synced.
          os.close(self._fd)
          self._fd = -1
          segments_lib.remove(self._path)
        self._open_segment(first)
        _write_all(self._fd, again)
        _sync_data(self._fd)
      except OSError as e2:
        raise self._failed(f'cannot fsync {self._path}', e2) from e2
      self._offset += len(again)
      self._unsynced = bytearray()
      self._unsynced_first = self._written_seq + 1
      self._unsynced_generation += 1
      self._synced_seq = self._written_seq
      self.last_sync_unix = time.time()
      segments_lib.fault_point('synced')

  def _segment_first(self) -> int:
    return segments_lib.first_seq_of(self._path)

  def _failed(self, what: str,
              cause: Optional[OSError]) -> errors.JournalWriteError:
    self.failures += 1
    reason = f': {cause.strerror or cause}' if cause else ''
    self._healthy(False)
    self._error = errors.JournalWriteError(
        f'journal of writer {self.writer_id}: {what}{reason}. What was '
        'appended is kept in memory and written again at the next call; free '
        'space or fix the disk (or turn the journal off).')
    return self._error


# Records are synced with fdatasync where there is one (as Redis syncs its
# append-only file): it skips the metadata a reader does not need (times),
# and still syncs the file's size.
_sync_data = getattr(os, 'fdatasync', os.fsync)


def _write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]
