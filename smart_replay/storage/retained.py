"""What a remote writer keeps of what it sent: journal records in memory.

A writer whose server may restart from an older checkpoint keeps every call
it made (`writing.journaling` records, numbered as a journal numbers them) in
`RetainedRecords`, in memory, so that it can send again what the restarted
server lacks (`resending.Resender.resend`). It offers the part of
`JournalWriter`'s interface an observer's `CallLog` uses (`append`,
`next_seq`, `check`, `flush`, `close`), and `contents()` for replay.

Memory is bounded: `drop_through(seq)` lets go of records a checkpoint holds
(the server's marks), and past `max_bytes` the oldest records go first; each
dropped record leaves a summary (`Dropped`: its number and the items it made
per stream and table), so that a re-send that would need it counts exactly
what is lost instead.
"""

import collections
import threading
from typing import (Any, Callable, Deque, Dict, List, NamedTuple, Optional,
                    Tuple)

from smart_replay.storage import journal_records
from smart_replay.storage import journal_segments

# Summaries of records dropped for memory kept at most; past it the oldest
# go, and a re-send that needs them counts their items as lost "at least".
MAX_DROPPED = 1 << 16
# Called with no arguments, returns None (in C).
_NOTHING = type(None)


class Dropped(NamedTuple):
  """A record dropped for memory: its number and `{(stream, table): items}`
  it made."""
  seq: int
  items: Dict[Any, int]


class RetainedRecords:
  """A writer's records, in memory, bounded.

  Args:
    writer_id: the writer's id (16 hex digits).
    meta: what the records encode (`journaling.journal_meta`).
    max_bytes: payload bytes kept at most (> 0).
    count_items: gives a record's `{(stream, table): items}` (for the
      summary a dropped record leaves).

  Attributes:
    next_seq: the number the next record gets (read it; an attribute, not a
      property, since an observer reads it at every step).

  Raises:
    ValueError: if `max_bytes` is not a positive integer.
  """

  def __init__(self, *, writer_id: str, meta: Dict[str, Any], max_bytes: int,
               count_items: Callable[[journal_records.Record],
                                     Dict[Any, int]]):
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or (
        max_bytes <= 0):
      raise ValueError(f'max_bytes must be a positive integer, got '
                       f'{max_bytes!r}.')
    self.writer_id = journal_segments.check_writer_id(writer_id)
    self.meta = meta
    self._max_bytes = max_bytes
    self._count_items = count_items
    # (seq, kind, payload) of each record kept: a tuple, not a `Record`
    # (made per step, a frozen dataclass costs a few Python calls more).
    self._records: Deque[Tuple[int, int, bytes]] = collections.deque()
    self._bytes = 0
    self.next_seq = 1
    self._lock = threading.Lock()
    self.dropped: Deque[Dropped] = collections.deque(maxlen=MAX_DROPPED)
    # Every record up to here was dropped (by marks or for memory).
    self.dropped_through = 0
    self.dropped_for_memory = 0  # Records, ever.
    # `check` in C: an observer calls it at every step (a Python call costs
    # about 1% of a low-dimensional step).
    self.check = _NOTHING

  bytes = property(lambda self: self._bytes, doc='Payload bytes kept.')

  def append(self, kind: int, payload: bytes) -> int:
    """Keeps one record; returns its number (the oldest go past the bound).

    Args:
      kind: the record's kind (`journaling.CALL`, ...).
      payload: its bytes.

    Returns:
      Its sequence number.
    """
    payload = bytes(payload)
    lock = self._lock
    lock.acquire()  # Not `with`: it costs twice as much, at every step.
    try:
      seq = self.next_seq
      self.next_seq = seq + 1
      self._records.append((seq, kind, payload))
      self._bytes += len(payload)
      while self._bytes > self._max_bytes and len(self._records) > 1:
        record = journal_records.Record(*self._records.popleft())
        self._bytes -= len(record.payload)
        self.dropped.append(Dropped(record.seq, self._count_items(record)))
        self.dropped_through = record.seq
        self.dropped_for_memory += 1
      return seq
    finally:
      lock.release()

  def drop_through(self, seq: int) -> int:
    """Lets go of the records up to `seq` (a checkpoint holds them).

    Args:
      seq: a record number.

    Returns:
      The records dropped.
    """
    with self._lock:
      count = 0
      while self._records and self._records[0][0] <= seq:
        self._bytes -= len(self._records.popleft()[2])
        count += 1
      self.dropped_through = max(self.dropped_through, seq)
      while self.dropped and self.dropped[0].seq <= seq:
        self.dropped.popleft()
      return count

  def contents(self) -> journal_segments.JournalContents:
    """The records kept, as a journal read from disk would give them."""
    with self._lock:
      records = [journal_records.Record(*r) for r in self._records]
    return journal_segments.JournalContents(
        writer_id=self.writer_id, meta=self.meta, records=records, damage=[],
        bytes=sum(len(r.payload) for r in records))

  def stats(self) -> Dict[str, Any]:
    """`{'records', 'bytes', 'next_seq', 'dropped_through',
    'dropped_for_memory'}`."""
    with self._lock:
      return {'records': len(self._records), 'bytes': self._bytes,
              'next_seq': self.next_seq,
              'dropped_through': self.dropped_through,
              'dropped_for_memory': self.dropped_for_memory}

  def check(self) -> None:
    """Nothing to check: memory does not fail (a `JournalWriter` raises
    here when its disk did)."""

  def flush(self) -> None:
    """Nothing to write."""

  def close(self) -> None:
    """Lets go of every record."""
    with self._lock:
      self._records.clear()
      self._bytes = 0
