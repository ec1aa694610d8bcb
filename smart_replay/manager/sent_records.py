"""What a client-mode manager's observers keep of what they sent.

A client observer of a server that may restart from an older checkpoint
keeps its calls (`writing.journaling` records), to send again what the
restarted server lacks (`resending.Resender.resend`, `watch.after_restart`):

* in memory (`storage.retained.RetainedRecords`, up to
  `WriteOptions.resend_bytes`), by default;
* in a journal folder on the client's machine (`RemoteBuffer.journal_dir`,
  `storage.journal.JournalWriter`, synced by `WriteOptions.journal`'s
  policy), so that a client started again after its own crash (or its
  machine's) sends what it had kept: its first observers adopt the
  folder's journals (their writer ids and numbering go on), and each sends
  what the server lacks before its first step. The folder is locked while
  a manager uses it.

Only where it can work: a client of servers (`Backend.resends`), a layout
with writer ids, without packed items (blocks are not made again).
"""

from typing import Any, List, Optional, Sequence, Tuple, Union

from absl import logging

from smart_replay.config import options as options_lib
from smart_replay.storage import journal as journal_lib
from smart_replay.storage import journal_segments
from smart_replay.storage import lock as lock_lib
from smart_replay.storage import retained as retained_lib
from smart_replay.writing import journaling
from smart_replay.writing import resending

Kept = Union[journal_lib.JournalWriter, retained_lib.RetainedRecords]


class SentRecords:
  """Makes what each client observer keeps of what it sent.

  Args:
    writes: the manager's `WriteOptions` (`resend_bytes`, `journal`).
    journal_dir: the client's journal folder, or None (memory).
  """

  def __init__(self, writes: options_lib.WriteOptions,
               journal_dir: Optional[str]):
    self._writes = writes
    self._dir = journal_dir
    self._lock: Optional[lock_lib.BufferLock] = None
    self._adoptable: List[str] = []

  def start(self) -> None:
    """Locks the journal folder (if any) and finds the journals a client
    before this one left there.

    Raises:
      BufferInUseError: if another manager uses the folder.
      UnsafeBufferDirError: if another user could change it.
    """
    if self._dir is None or self._lock is not None:
      return
    self._lock = lock_lib.BufferLock(self._dir).acquire()
    self._adoptable = sorted(journal_segments.segments(self._dir))
    if self._adoptable:
      logging.info('The journal folder %s holds the journals of writer(s) '
                   '%s: the first observers take them over and send again '
                   'what the server lacks.', self._dir, self._adoptable)

  def new(self, *, usable: bool, layout: Any, data_spec: Any,
          num_envs: Optional[int], tables: List[str],
          block_tables: Sequence[str] = ()
          ) -> Tuple[Optional[Kept], bool]:
    """What a new observer keeps, and whether it took over a journal.

    Args:
      usable: whether the buffer allows it (a client of servers, a layout
        with writer ids).
      layout: the buffer's layout.
      data_spec: the spec of one step.
      num_envs: the observer's environments per call.
      tables: the tables' names.
      block_tables: those of packed items (their dropped calls are counted
        in windows).

    Returns:
      `(kept, adopted)`: None without anything to keep.

    Raises:
      JournalWriteError: if a journal cannot be made in the folder.
    """
    if not usable:
      return None, False
    meta = journaling.journal_meta(layout, data_spec, num_envs=num_envs,
                                   tables=tables)
    if self._dir is None:
      if not self._writes.resend_bytes:
        return None, False
      return retained_lib.RetainedRecords(
          writer_id=journal_segments.new_writer_id(), meta=meta,
          max_bytes=self._writes.resend_bytes,
          count_items=lambda record: resending.count_items(
              record, meta['columns'], tables, block_tables)), False
    sync = (journal_lib.DEFAULT_SYNC
            if self._writes.journal in (options_lib.JOURNAL_AUTO, False)
            else self._writes.journal)
    while self._adoptable:
      writer_id = self._adoptable.pop(0)
      old = journal_segments.read(self._dir, writer_id)
      if not old.records:  # Nothing to send again: no need to go on.
        journal_segments.remove_writer(self._dir, writer_id)
        continue
      if {k: old.meta.get(k) for k in meta} != meta:
        logging.warning(
            'The journal of writer %s in %s was written by an observer of '
            'other tables, columns or num_envs; it is left there.',
            writer_id, self._dir)
        continue
      return journal_lib.JournalWriter(
          self._dir, writer_id=writer_id, meta=meta, sync=sync,
          first_seq=old.last_seq + 1), True
    return journal_lib.JournalWriter(
        self._dir, writer_id=journal_segments.new_writer_id(), meta=meta,
        sync=sync), False

  def close(self) -> None:
    """Lets go of the folder's lock; safe to call more than once."""
    if self._lock is not None:
      self._lock.release()
      self._lock = None
