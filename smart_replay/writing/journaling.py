"""What an observer's write-ahead journal records, and replaying it.

Each call of a `TrajectoryObserver` (a step, or batch of steps; an end of
episode) becomes one journal record (`storage.journal`): the layout's columns
of the step, as the layout already encodes them, and what the call did with
them, in order: each stream's transport operations (append the step, defer an
item of a table with its priority and length, end the chunk, end the
episode) and the packed tables' (add the step, end the episode). A flush of
the observer is a record of its own, since it completes packed blocks early.

Replaying a record runs the same operations on fresh writers, with no
planner: the items come out as they were made, whatever the tables, the
layout or the episodes. A checkpoint records each writer's mark (its last
record whose items the checkpoint holds: the observer was flushed, under the
manager's lock) and where its context starts (`keep_from`: the oldest record
holding a step a later item may reference, i.e. the streams' writer
histories). Replay runs the records from `keep_from`: those up to the mark
only append their steps again (the context the next items reference), those
after it everything. So each item after the mark is stored once, and none
before it again.

A frame-stacked layout's streams append cells (the new frames of a step,
compressed: `layouts.frame_cells`), not whole stacks: its records hold those
cells as the streams encoded them (APPEND_CELLS ops), not the call's columns
(a Pong step: about 1 KB instead of 28 KB), unless a table of packed items
needs the columns too.

Record payload (little-endian): a header `<BBHIII` (format, columns, ops,
and what the call counted: steps, environment steps, episodes); format 2
only: the cells, `<I` their count, `<I` each one's length, their bytes;
each column's bytes (dtypes and shapes are in the journal's `meta`,
`describe_columns`), the step types (`int8[streams]`), then the ops,
`<BHHdI` each (code, stream, table index, priority, length; an APPEND_CELLS
op's length is its cells' count, taken in order).
"""

import collections
import dataclasses
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from smart_replay.spec import specs
from smart_replay.storage import journal as journal_lib
from smart_replay.storage import journal_segments
from smart_replay.writing import settings as settings_lib
from smart_replay.writing import writer as writer_lib

# Record kinds of an observer's journal.
CALL = 1
FLUSH = 2
CLEAR = 3  # The manager emptied the tables (`clear()`).
FORMAT = 1
FORMAT_CELLS = 2  # Records that hold a frame-stacked layout's cells.
# Operations (their codes in a record).
APPEND, DEFER, END_CHUNK, END_EPISODE, FINISH_EPISODE = 1, 2, 3, 4, 5
BLOCK_ADD, BLOCK_END_EPISODE = 6, 7
APPEND_CELLS = 8
STREAM_OPS = (APPEND, DEFER, END_CHUNK, END_EPISODE, FINISH_EPISODE,
              APPEND_CELLS)
_HEADER = struct.Struct('<BBHIII')
_OP = struct.Struct('<BHHdI')
_COUNT = struct.Struct('<I')
_BLANK_HEADER = bytes(_HEADER.size)


def describe_columns(columns: Sequence[np.ndarray]) -> List[Dict[str, Any]]:
  """The dtypes and shapes of one call's columns, for the journal's meta.

  Args:
    columns: the layout's columns of a call (batched ones with the
      environments' dimension).

  Returns:
    `[{'dtype': numpy's dtype string, 'shape': [...]}]`.
  """
  return [{'dtype': np.asarray(c).dtype.str, 'shape': list(np.shape(c))}
          for c in columns]


def journal_meta(layout: Any, data_spec: Any, *, num_envs: Optional[int],
                 tables: Sequence[str]) -> Dict[str, Any]:
  """What an observer's journal records its records encode (its `meta`).

  Args:
    layout: the observer's layout (`packed_steps.Layout` or a frame-stacked
      one).
    data_spec: the spec of one step.
    num_envs: environments per call, or None.
    tables: the tables' names, in the order records index them.

  Returns:
    `{'format', 'columns': describe_columns(...) of a zero step, 'num_envs',
    'tables', 'layout'}` (JSON).
  """
  lead = () if num_envs is None else (num_envs,)
  zeros = [np.zeros(lead + tuple(leaf.shape), leaf.dtype)
           for leaf in specs.flatten_spec(data_spec)]
  return {'format': FORMAT,
          'columns': describe_columns(layout.columns(zeros)),
          'num_envs': num_envs, 'tables': list(tables),
          'layout': layout.describe()}


_defer = writer_lib.StreamWriter.defer
_end_chunk = writer_lib.StreamWriter.end_chunk


class RecordedStream(writer_lib.StreamWriter):
  """A `StreamWriter` that also records what it is asked to do in the
  observer's `CallLog` (as stream `index`).

  Args:
    settings: the observer's `WriterSettings`.
    log: the observer's `CallLog`.
    index: this stream's index among the observer's.
  """

  def __init__(self, settings: settings_lib.WriterSettings, log: 'CallLog',
               index: int):
    self._log, self._index = log, index
    self._ending = False
    # What `CallLog.appended` does, inlined below.
    self._append_op = log.plain_ops(APPEND)[index]
    self._records = log.stream_history(index)
    super().__init__(settings)

  # An observer calls append and defer at every step (and end_chunk at every
  # chunk): each Python call costs about 1% of a low-dimensional step, so
  # they record the op themselves (as `CallLog.appended` and `op` would),
  # and call the base class's methods directly (append: what its body
  # does).

  def append(self, step: List[np.ndarray]) -> bool:
    log = self._log
    if log.records_cells:
      cells = self.encode(step)
      log.appended_cells(self._index, cells)
      return self.append_cells(cells)
    log.ops += self._append_op
    self._records.append(log.seq)
    # `StreamWriter.append`'s body.
    return self.append_cells(self._encoder.cells(step, first=not self.history))

  def defer(self, table: str, priority: float, length: int) -> None:
    log = self._log
    log.ops += _OP.pack(DEFER, self._index, log.table_index[table], priority,
                        length)
    _defer(self, table, priority, length)

  def end_chunk(self) -> None:
    self._log.plain_op(END_CHUNK, self._index)
    _end_chunk(self)

  def end_episode(self) -> None:
    self._log.plain_op(END_EPISODE, self._index)
    self._ending = True  # Its finish_episode is part of it.
    try:
      super().end_episode()
    finally:
      self._ending = False

  def finish_episode(self) -> None:
    if not self._ending:
      self._log.plain_op(FINISH_EPISODE, self._index)
    super().finish_episode()

  def _forget_cells(self) -> None:
    super()._forget_cells()
    if hasattr(self, '_log'):  # Not while the base class starts.
      self._log.forget(self._index)


@dataclasses.dataclass
class Call:
  """One decoded record of a call.

  Attributes:
    columns: the call's columns (none when its cells are recorded).
    step_types: its step types, one per stream.
    counted: what the call added to the observer's `steps`, `env_steps`
      and `episodes` counters.
    ops: `(code, stream, table index, priority, length)` in order.
    cells: the cells its APPEND_CELLS ops appended, in order (bytes).
  """
  columns: List[np.ndarray]
  step_types: np.ndarray
  counted: Tuple[int, int, int]
  ops: List[tuple]
  cells: List[bytes] = dataclasses.field(default_factory=list)

  def take_cells(self, count: int, start: int) -> List[List[np.ndarray]]:
    """`count` cells from `start`, as a stream appends them (`[[blob],
    ...]`)."""
    return [[np.array(blob, object)]
            for blob in self.cells[start:start + count]]


class CallLog:
  """Collects the operations of the observer call in progress and writes
  them to the journal as one record.

  Args:
    journal: the observer's journal.
    tables: the tables' names, in the order records index them.
    keep_alive: the steps of a stream's writer history (`WriterSettings`).
    num_streams: the observer's streams.
    step_types: whether records keep the calls' step types (the packed
      tables' replay needs them).
    cells: whether the streams append cells (a frame-stacked layout):
      records keep those instead of the call's columns (unless the packed
      tables, `step_types`, need the columns).

  Attributes:
    records_cells: whether records keep the streams' cells.
    ops: the record of the call in progress, its ops last (`_OP.size`
      bytes each): a `RecordedStream` adds its per-step ones itself.
    seq: the number the record of the call in progress gets.
    table_index: each table's index in records.
  """

  def __init__(self, journal: journal_lib.JournalWriter, *,
               tables: Sequence[str], keep_alive: int, num_streams: int,
               step_types: bool, cells: bool = False):
    self.journal = journal
    self._step_types = step_types
    self.records_cells = cells
    self._columns = not cells or step_types
    self._cells: List[bytes] = []
    self.table_index = {name: index for index, name in enumerate(tables)}
    self.ops = bytearray()
    self._ops_at = 0  # Where `ops` holds the first op.
    self._num_columns = 0
    self._counted = (0, 0, 0)
    self.seq = 0
    # Per stream, the record of each step its writer history holds.
    self._history = [collections.deque(maxlen=keep_alive)
                     for _ in range(num_streams)]
    # Per op without arguments, per stream, the op packed once.
    self._plain = {code: [_OP.pack(code, stream, 0, 0.0, 0)
                          for stream in range(num_streams)]
                   for code in (APPEND, END_CHUNK, END_EPISODE,
                                FINISH_EPISODE)}
    self._appends = self._plain[APPEND]

  def plain_ops(self, code: int) -> List[bytes]:
    """Per stream, the op `code` (one without arguments), packed."""
    return self._plain[code]

  def stream_history(self, stream: int) -> collections.deque:
    """The records of the steps `stream`'s writer history holds (append
    `seq` to it as a step is appended)."""
    return self._history[stream]

  def begin(self, columns: Sequence[np.ndarray], step_types: Any,
            counters: Any) -> None:
    """Starts the record of a call that took these columns (none for an
    end of episode); `counters` are the observer's, before the call."""
    # The record is built in one buffer (a Python call costs about 1% of a
    # low-dimensional step): its header, filled in at commit (the cells go
    # after it then), the columns, the step types, then the ops.
    record = bytearray(_BLANK_HEADER)
    if self._columns:
      self._num_columns = len(columns)
      for column in columns:
        record += column.tobytes()
    if self._step_types:
      record += np.asarray(step_types, np.int8).tobytes()
    self._ops_at = len(record)
    self.ops = record
    self._counted = (counters.steps, counters.env_steps, counters.episodes)
    if self._cells:
      self._cells = []
    self.seq = self.journal.next_seq

  def op(self, code: int, stream: int = 0, table: Optional[str] = None,
         priority: float = 0.0, length: int = 0) -> None:
    """Records one operation of the call in progress (an APPEND goes
    through `appended`)."""
    self.ops += _OP.pack(code, stream,
                         self.table_index[table] if table else 0, priority,
                         length)

  def plain_op(self, code: int, stream: int) -> None:
    """Records an op without arguments (END_CHUNK, END_EPISODE,
    FINISH_EPISODE) on `stream`, from bytes packed once."""
    self.ops += self._plain[code][stream]

  def appended(self, stream: int) -> None:
    """Records an APPEND on `stream`, the most frequent op, from bytes
    packed once."""
    self.ops += self._appends[stream]
    self._history[stream].append(self.seq)

  def appended_cells(self, stream: int, cells: List[List[np.ndarray]]
                     ) -> None:
    """Records the cells a stream appended for a step (`[[blob], ...]`)."""
    self.ops += _OP.pack(APPEND_CELLS, stream, 0, 0.0, len(cells))
    self._cells += [cell[0].item() for cell in cells]
    self._history[stream].append(self.seq)

  def forget(self, stream: int) -> None:
    """A stream's writer dropped its history (an episode end that clears
    it, a restart)."""
    self._history[stream].clear()

  def commit(self, counters: Any) -> Optional[int]:
    """Writes the call's record; returns its sequence number (None for a
    call that did nothing).

    Args:
      counters: the observer's counters after the call.

    Raises:
      JournalWriteError: if the journal cannot take it (see `storage.
        journal`; the record is kept in memory).
    """
    steps, env_steps, episodes = self._counted
    steps = counters.steps - steps
    env_steps = counters.env_steps - env_steps
    episodes = counters.episodes - episodes
    record, cells = self.ops, self._cells
    self.ops = b''  # Until the next call's `begin` (nothing changes `record`).
    num_ops = (len(record) - self._ops_at) // _OP.size
    if not num_ops and not (steps or env_steps or episodes):
      return None
    _HEADER.pack_into(record, 0, FORMAT_CELLS if cells else FORMAT,
                      self._num_columns, num_ops, steps, env_steps, episodes)
    if cells:
      record[_HEADER.size:_HEADER.size] = b''.join(
          [_COUNT.pack(len(cells)),
           np.array([len(c) for c in cells], '<u4').tobytes()] + cells)
      self._cells = []
    return self.journal.append(CALL, record)

  def flushed(self) -> int:
    """Writes a record of a flush of the observer; returns its number."""
    return self.journal.append(FLUSH, b'')

  def cleared(self) -> int:
    """Writes a record of the tables emptied (the observer's episodes were
    ended first: later items reference no earlier step)."""
    for history in self._history:
      history.clear()
    return self.journal.append(CLEAR, b'')

  def keep_from(self) -> int:
    """The oldest record a later item may reference a step of."""
    return min([h[0] for h in self._history if h] + [self.journal.next_seq])


def decode(payload: bytes, columns: Sequence[Dict[str, Any]]) -> Call:
  """Decodes a call's record.

  Args:
    payload: the record's payload.
    columns: the journal meta's `describe_columns`.

  Returns:
    The `Call`.

  Raises:
    ValueError: if the payload does not match the columns.
  """
  version, num_columns, num_ops, *counted = _HEADER.unpack_from(payload)
  if not num_columns:  # A call without a step, or one of cells.
    columns = []
  if version not in (FORMAT, FORMAT_CELLS) or num_columns != len(columns):
    raise ValueError(f'a journal record of format {version} with '
                     f'{num_columns} column(s); expected format {FORMAT} or '
                     f'{FORMAT_CELLS} with {len(columns)}.')
  offset, out, cells = _HEADER.size, [], []
  if version == FORMAT_CELLS:
    count, = _COUNT.unpack_from(payload, offset)
    offset += _COUNT.size
    lengths = np.frombuffer(payload, '<u4', count, offset)
    offset += 4 * count
    for length in lengths.tolist():
      cells.append(payload[offset:offset + length])
      offset += length
  for column in columns:
    dtype = np.dtype(column['dtype'])
    count = int(np.prod(column['shape'], dtype=np.int64))
    out.append(np.frombuffer(payload, dtype, count, offset).reshape(
        column['shape']))
    offset += count * dtype.itemsize
  streams = len(payload) - offset - num_ops * _OP.size
  step_types = np.frombuffer(payload, np.int8, streams, offset)
  offset += streams
  ops = [_OP.unpack_from(payload, offset + i * _OP.size)
         for i in range(num_ops)]
  return Call(out, step_types, tuple(counted), ops, cells)


@dataclasses.dataclass
class Replayed:
  """What `replay` did.

  Attributes:
    records: records read from `keep_from` on.
    after_mark: of those, the ones after the mark (replayed whole).
    counted: what the records after the mark had counted: `steps`,
      `env_steps`, `episodes`.
    items: items created again, per table.
  """
  records: int = 0
  after_mark: int = 0
  counted: List[int] = dataclasses.field(default_factory=lambda: [0, 0, 0])
  items: Dict[str, int] = dataclasses.field(default_factory=dict)


def last_clear(contents: journal_segments.JournalContents,
               after: int) -> Optional[int]:
  """The last record of a `clear()` after record `after`, or None."""
  found = [r.seq for r in contents.records
           if r.kind == CLEAR and r.seq > after]
  return found[-1] if found else None


def replay(contents: journal_segments.JournalContents, *, mark: int,
           keep_from: int, streams: Sequence[Any], blocks: Any,
           tables: Sequence[str], batched: bool) -> Replayed:
  """Runs a writer's journaled operations again (see the module doc).

  Args:
    contents: the writer's journal, read.
    mark: its last record the restored checkpoint holds (0: none).
    keep_from: the first record replay may need.
    streams: fresh `StreamWriter`s, one per stream of the journaled
      observer.
    blocks: a fresh `BlockWriter` (packed tables), or None.
    tables: the tables' names, in the order the records index them.
    batched: whether the journaled observer took batches (`num_envs`).

  Returns:
    What was replayed; the writers are flushed.

  Raises:
    ValueError: if a record does not decode.
  """
  columns_meta = contents.meta['columns']
  done = Replayed()
  for record in contents.records:
    if record.seq < keep_from:
      continue
    done.records += 1
    whole = record.seq > mark
    done.after_mark += whole
    if record.kind == CLEAR:
      continue  # The caller replays from after the last one.
    if record.kind == FLUSH:
      if whole:
        for out in streams:
          out.flush()
        if blocks:
          blocks.flush()
      continue
    call = decode(record.payload, columns_meta)
    if whole:
      done.counted = [a + b for a, b in zip(done.counted, call.counted)]
    cursor = [0]
    for op in call.ops:
      code, stream, table, priority, length = op
      if code == DEFER:
        if whole:
          streams[stream].defer(tables[table], priority, length)
          done.items[tables[table]] = done.items.get(tables[table], 0) + 1
      elif code in STREAM_OPS:
        run_stream_op(streams[stream], op, call, batched=batched,
                      cursor=cursor)
      elif whole and code == BLOCK_ADD:
        blocks.add(call.columns, call.step_types if batched else
                   call.step_types[0], batched=batched)
      elif whole and code == BLOCK_END_EPISODE:
        blocks.end_episode()
    _fault_point('replayed')
  for out in streams:
    out.flush()
  if blocks:
    blocks.flush()
  return done


def run_stream_op(out: Any, op: tuple, call: Call, *, batched: bool,
                  cursor: List[int]) -> None:
  """Runs one of a call's stream operations other than DEFER again.

  Args:
    out: the op's stream's writer.
    op: `(code, stream, table index, priority, length)`.
    call: the decoded call.
    batched: whether the writer took batches (`num_envs`).
    cursor: `[the index of the call's next cell]`, moved on by the
      APPEND_CELLS ops.
  """
  code, stream, _, _, length = op
  if code == APPEND:
    out.append([c[stream] for c in call.columns] if batched else
               list(call.columns))
  elif code == APPEND_CELLS:
    out.append_cells(call.take_cells(length, cursor[0]))
    cursor[0] += length
  elif code == END_CHUNK:
    out.end_chunk()
  elif code == END_EPISODE:
    out.end_episode()
  else:
    out.finish_episode()


def _fault_point(step: str) -> None:
  """A named step of replaying a journal: 'replayed', after each record
  (`replay`); 'resent', after each record `resending.resend` ran.

  Does nothing; durability tests replace it to kill the process there.
  """
  del step
