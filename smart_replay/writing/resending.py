"""Sending again what a restarted server lacks of one writer's items.

A client observer keeps its calls (`journaling` records: in memory,
`storage.retained`, or in its client's journal folder, `storage.journal`).
When its server comes back from a checkpoint, the observer is flushed (every
item it made is then stored or lost, none on its way), the server says what
it has of the writer's items now (`storage.writer_marks`), and `resend` makes
the rest again from the kept calls, in order, on writers of their own:

* below the **floors**, the restored checkpoint's marks, the server has
  every item of a stream and table, or let it go (a FIFO evicted it);
* above them it has what Reverb's writer sent again by itself after it
  reconnected (the items in flight when the server died) and new items:
  the server lists them (`held`).

Tables of packed items are counted in windows, and the windows the server
lacks are packed into new blocks (`block_resending`).

`Resender` is an observer's part of it: its floors (a checkpoint that may
have been written during a re-send gives none: it may lack a gap below its
marks), a re-send that failed and waits for the next check, letting go of
what the newest checkpoint holds (`prune`), and forgetting what was sent
before a restore someone asked for (`forget_sent`).
"""

import collections
import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from absl import logging
from tf_agents.trajectories import time_step as ts

from smart_replay.storage import journal_segments
from smart_replay.writing import block_resending
from smart_replay.writing import block_writer
from smart_replay.writing import confirmations as confirmations_lib
from smart_replay.writing import counters as counters_lib
from smart_replay.writing import journaling
from smart_replay.writing import settings as settings_lib
from smart_replay.writing import writer as writer_lib


_FIRST = int(ts.StepType.FIRST)

Floors = Dict[Tuple[int, str], Tuple[int, int]]
Held = Dict[Tuple[int, str], Dict[int, int]]


def count_items(record: Any, columns: Sequence[Dict[str, Any]],
                tables: Sequence[str], block_tables: Sequence[str] = ()
                ) -> Dict[Tuple[int, str], int]:
  """The items a record made, per stream and table.

  Args:
    record: a record (`seq`, `kind`, `payload`).
    columns: the journal meta's `describe_columns`.
    tables: the tables' names, in the order records index them.
    block_tables: those of packed items, counted in windows: one per row
      that does not begin an episode (exact for windows of 2 steps; for
      longer ones an episode's first rows count too).

  Returns:
    `{(stream, table): items}` (empty for a record that is not a call).
  """
  if record.kind != journaling.CALL:
    return {}
  counts = collections.Counter()
  call = journaling.decode(record.payload, columns)
  for code, stream, table, _, _ in call.ops:
    if code == journaling.DEFER:
      counts[(stream, tables[table])] += 1
    elif code == journaling.BLOCK_ADD:
      for index, step_type in enumerate(call.step_types):
        if int(step_type) != _FIRST:
          for name in block_tables:
            counts[(index, name)] += 1
  return dict(counts)


@dataclasses.dataclass
class Resent:
  """What `resend` did.

  Attributes:
    records: records run (from the oldest kept, or the last `clear()`).
    items: items made again, per table.
    lost: items above the marks that could not be made again (a step they
      hold was no longer kept), per table.
  """
  records: int = 0
  items: Dict[str, int] = dataclasses.field(default_factory=dict)
  lost: Dict[str, int] = dataclasses.field(default_factory=dict)


def _held(key: Tuple[int, str], seq: int, *, floors: Floors,
          held: Held) -> float:
  """How many items of `key` ending at call `seq` the server holds or let go
  of: all those below the floor (infinity), the floor's count at it (or
  more, if it holds more), else those it holds now."""
  floor_seq, floor_items = floors.get(key, (0, 0))
  if seq < floor_seq:
    return math.inf
  now = held.get(key, {}).get(seq, 0)
  return max(floor_items, now) if seq == floor_seq else now


def resend(contents: journal_segments.JournalContents, *, floors: Floors,
           held: Held, streams: Sequence[Any], tables: Sequence[str],
           batched: bool,
           blocks: Optional[block_resending.BlockGaps] = None) -> Resent:
  """Makes again the items a server lacks, from a writer's kept records.

  Every step of the records is appended again (the context later items
  reference). Of the items of stream `s` and table `t` ending at call `n`,
  those the server has are skipped: every one below the floor `(seq,
  items)` of `(s, t)` (the restored checkpoint holds, or has let go of,
  them), at the floor its `items` first ones (or as many as it holds now, if
  more), above it as many as it holds now (`held`: items the writer's old
  connection sent again by itself after the restart, and new ones); the
  rest are made again, in order. The windows of packed tables the server
  lacks go to `blocks`, which packs them into new blocks. An item whose
  steps (and a frame stack's cells before them) are no longer all kept is
  counted lost instead.

  Args:
    contents: the writer's kept records (`storage.retained`).
    floors: `{(stream, table): (seq, items)}`; missing: `(0, 0)`.
    held: `{(stream, table): {seq: items}}` the server holds now above
      (and at) the floors.
    streams: fresh `StreamWriter`s, one per stream of the writer.
    tables: the tables' names, in the order the records index them.
    batched: whether the writer took batches (`num_envs`).
    blocks: the writer's packed tables' `block_resending.BlockGaps` (its
      `is_held` answering from the same floors and `held`), or None.

  Returns:
    What was made again (packed tables: blocks made, windows lost); the
    writers are flushed.

  Raises:
    ValueError: if a record does not decode.
    WaitTimeoutError, ServerUnavailableError, WriteFailedError: as the
      streams' writes.
  """
  columns_meta = contents.meta['columns']
  records = contents.records
  cleared = [i for i, r in enumerate(records)
             if r.kind == journaling.CLEAR]
  if cleared:  # Items before a clear() are not the server's to hold.
    records = records[cleared[-1] + 1:]
  done = Resent()
  for record in records:
    done.records += 1
    if record.kind == journaling.FLUSH:
      for out in streams:
        out.flush()
      continue
    if record.kind != journaling.CALL:
      continue
    call = journaling.decode(record.payload, columns_meta)
    skipped = collections.Counter()  # Items of this call the server has.
    cursor = [0]
    for op in call.ops:
      code, stream, table, priority, length = op
      if code == journaling.BLOCK_ADD and blocks:
        blocks.add(call.columns, call.step_types, record.seq)
        continue
      if code == journaling.BLOCK_END_EPISODE and blocks:
        blocks.end_episode()
        continue
      if code not in journaling.STREAM_OPS:
        continue
      out = streams[stream]
      if code == journaling.DEFER:
        name = tables[table]
        key = (stream, name)
        if skipped[key] < _held(key, record.seq, floors=floors, held=held):
          skipped[key] += 1
          continue
        if len(out.history) < length + out.lookback:  # Its cells are gone.
          done.lost[name] = done.lost.get(name, 0) + 1
          continue
        out.defer(name, priority, length)
        done.items[name] = done.items.get(name, 0) + 1
      else:
        journaling.run_stream_op(out, op, call, batched=batched,
                                 cursor=cursor)
    _fault_point('resent')
  for out in streams:
    out.flush()
  if blocks:
    blocks.finish()
    for name, count in blocks.items.items():
      done.items[name] = done.items.get(name, 0) + count
    for name, count in blocks.lost.items():
      done.lost[name] = done.lost.get(name, 0) + count
  return done


def lost_in_dropped(dropped: Sequence[Any], *, dropped_through: int,
                    floors: Floors, held: Held
                    ) -> Tuple[Dict[str, int], bool]:
  """Items the server lacks that were in records no longer kept.

  Args:
    dropped: summaries of records dropped for memory
      (`retained.Dropped`), oldest first.
    dropped_through: every record up to here was dropped.
    floors, held: as `resend` takes them.

  Returns:
    `({table: items}, exact)`: `exact` is False when some dropped records
    above a floor left no summary (the count is then a lower bound).
  """
  lost = collections.Counter()
  for summary in dropped:
    for key, items in summary.items.items():
      missing = items - _held(key, summary.seq, floors=floors, held=held)
      if missing > 0:
        lost[key[1]] += missing
  first = dropped[0].seq if dropped else dropped_through + 1
  lowest = min((seq for seq, _ in floors.values()), default=0)
  exact = first <= lowest + 1 or dropped_through == 0
  return dict(lost), exact


class Resender:
  """What one observer needs to send again what a restarted server lacks.

  Attributes:
    pending: a re-send failed (the server went down again); the manager's
      watcher tries it again (`manager.watch.after_restart`).

  Args:
    log: the observer's `journaling.CallLog` (its journal keeps the calls).
    settings: the observer's `WriterSettings` (the re-send's writers get
      counters of their own).
    counters: the observer's counters (`resent_items`, `lost_items`,
      `lost_at_restart`).
    lock: the observer's lock.
    tables: the tables' names, in the order records index them.
    block_tables: the resolved configs of its tables of packed items.
    layout: the buffer's `protocol.StepLayout` (for the blocks' rows).
    num_streams: the observer's streams.
    batched: whether it takes batches (`num_envs`).
  """

  def __init__(self, *, log: journaling.CallLog,
               settings: settings_lib.WriterSettings,
               counters: counters_lib.Counters, lock: Any,
               tables: Sequence[str], block_tables: Sequence[Any],
               layout: Any, num_streams: int, batched: bool):
    self._log, self._settings = log, settings
    self._counters, self._lock = counters, lock
    self._tables, self._block_tables = list(tables), list(block_tables)
    self._layout = layout
    self._num_streams, self._batched = num_streams, batched
    # Calls kept before a packed table's floor, for the rows of the windows
    # after it (an end of episode or a flush is a call without a row).
    self._block_margin = 2 * max(
        (t.sequence_length for t in self._block_tables), default=0) + (
            8 if self._block_tables else 0)
    self.pending = False
    # Per (stream, table), `(seq, items)` below which the server has every
    # item, or let it go; checkpoints numbered from `_safe_from` on may give
    # new floors.
    self._floors: Floors = {}
    self._safe_from: float = 0
    # Floors `forget_sent` left (a requested restore): never lowered.
    self._forgotten: Floors = {}

  @property
  def kept(self) -> Any:
    """What the observer keeps (`RetainedRecords` or `JournalWriter`)."""
    return self._log.journal

  def floor(self) -> int:
    """The oldest call a re-send needs the server to list (`above`): the
    lowest floor."""
    with self._lock:
      return min((seq for seq, _ in self._floors.values()), default=0)

  def resend(self, answer: Dict[str, Any]) -> Resent:
    """Sends again what the server lacks (see the module doc).

    Call it with the lock held, after the observer's `flush()`.

    Args:
      answer: `Backend.writer_marks(live=True)`: `{'number': the restored
        checkpoint's number or None, 'marks': {table: {stream: [seq,
        items]}} or None, 'held': {table: {stream: [seq, ...]}}}`.

    Returns:
      What was sent again (`Resent`); items the server lacks that are no
      longer kept are counted in the observer's `lost_items` and
      `lost_at_restart`, exactly (logged "at least" when even their
      summaries are gone).

    Raises:
      WaitTimeoutError, ServerUnavailableError, WriteFailedError: as the
        observer's writes (nothing is counted; call it again once the
        server answers).
    """
    with self._lock:
      number, marks = answer.get('number'), answer.get('marks')
      if marks is not None and number is not None and (
          number >= self._safe_from):
        self._floors = self._with_forgotten(_floors_of(marks))
      floors = self._floors
      self._safe_from = float('inf')  # Until this re-send is done.
      held = _keyed(answer.get('held') or {},
                    lambda seqs: dict(collections.Counter(seqs)))
      kept = self.kept
      settings = dataclasses.replace(
          self._settings, reconnected=None,
          counters=counters_lib.Counters.for_tables(self._tables, []),
          confirmations=confirmations_lib.ConfirmationLog())
      streams = [writer_lib.StreamWriter(settings)
                 for _ in range(self._num_streams)]
      out = blocks = None
      if self._block_tables:
        out = block_writer.BlockWriter(
            self._block_tables, settings=settings, layout=self._layout,
            num_streams=self._num_streams)
        blocks = block_resending.BlockGaps(
            self._block_tables, layout=self._layout, out=out,
            num_streams=self._num_streams, batched=self._batched,
            is_held=lambda key, seq: _held(
                key, seq, floors=floors, held=held) >= 1,
            fresh=kept.dropped_through == 0)
      try:
        done = resend(kept.contents(), floors=floors, held=held,
                      streams=streams, tables=self._tables,
                      batched=self._batched, blocks=blocks)
      finally:
        for stream in streams:
          stream.close()
        if out is not None:
          out.close()
      dropped, exact = lost_in_dropped(
          kept.dropped, dropped_through=kept.dropped_through, floors=floors,
          held=held)
      lost = sum(done.lost.values()) + sum(dropped.values())
      self._counters.resent_items += sum(done.items.values())
      self._counters.lost_items += lost
      self._counters.lost_at_restart += lost
    logging.info(
        'Sent %s item(s) again to the restarted server at %s (writer %s; '
        '%d record(s) run)%s.', done.items or 0,
        self._settings.client.server_address, kept.writer_id, done.records,
        f'; {"" if exact else "at least "}{lost} item(s) it lacks were no '
        'longer kept (counted in num_lost_items)' if lost else '')
    return done

  def resend_done(self, newest: Optional[int]) -> None:
    """Records that a re-send is complete, once the server's newest
    checkpoint (`newest`, its number, or None) is known: a checkpoint
    numbered 2 or more above it began after the re-send and holds it, so
    its marks may become floors (`resend`, `prune`)."""
    with self._lock:
      self._safe_from = (newest or 0) + 2
      self.pending = False

  def forget_sent(self) -> None:
    """After a restore someone asked for (the buffer is to be as an older
    checkpoint was): nothing sent so far is sent again, and the kept calls
    go (but the steps later items need)."""
    with self._lock:
      last = self.kept.next_seq - 1
      self._forgotten = {(stream, table): (last, 1 << 62)
                         for stream in range(self._num_streams)
                         for table in self._tables}
      self._floors = self._with_forgotten(self._floors)
      self.pending = False
      self.kept.drop_through(self._log.keep_from() - 1)

  def prune(self, answer: Dict[str, Any]) -> None:
    """Lets go of kept calls the server's newest checkpoint holds.

    Nothing goes while a re-send is not done, when the checkpoint is older
    than the last re-send, or when it lacks a mark of some stream and table
    (the calls might still be needed).

    Args:
      answer: `Backend.writer_marks()` (not live): `{'number', 'marks'}`.
    """
    number, marks = answer.get('number'), answer.get('marks')
    with self._lock:
      if marks is None or number is None or number < self._safe_from:
        return
      self._floors = self._with_forgotten(_floors_of(marks))
      if len(self._floors) < self._num_streams * len(self._tables):
        return
      # Each stream's steps are kept from its oldest floor on (and the rows
      # before it a packed table's next windows need), and from the oldest
      # step a later item may reference.
      lowest = min(seq for seq, _ in self._floors.values())
      self.kept.drop_through(min(lowest - 1 - self._block_margin,
                                 self._log.keep_from() - 1))

  def _with_forgotten(self, floors: Floors) -> Floors:
    """`floors`, each at least what `forget_sent` left behind."""
    merged = dict(floors)
    for key, floor in self._forgotten.items():
      merged[key] = max(merged.get(key, (0, 0)), floor)
    return merged


def _keyed(per_table: Dict[str, Dict[str, Any]],
           value: Callable[[Any], Any]) -> Dict[Tuple[int, str], Any]:
  """`{table: {stream: v}}` as `{(stream, table): value(v)}`."""
  return {(int(stream), table): value(v)
          for table, streams in per_table.items()
          for stream, v in streams.items()}


def _floors_of(marks: Dict[str, Dict[str, Any]]) -> Floors:
  """Marks `{table: {stream: [seq, items]}}` as floors."""
  return _keyed(marks, lambda mark: (int(mark[0]), int(mark[1])))


def _fault_point(step: str) -> None:
  """A named step of a re-send: 'resent', after each record `resend` ran.

  Does nothing; tests replace it (e.g. to restart the server there).
  """
  del step
