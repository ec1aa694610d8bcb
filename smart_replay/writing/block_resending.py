"""Making again the windows of packed tables that a restarted server lacks.

A table of packed items stores blocks: rows of consecutive steps of one
stream, each block holding every window of `sequence_length` steps that ends
in its rows (a block cut because it is full, or by a flush, repeats the last
`sequence_length - 1` rows in the next one). A server answers which windows
of a writer it holds: `storage.writer_marks` counts such a table in windows,
a window by the call of its last row.

`BlockGaps` runs a writer's kept calls again (`resending.resend`) and packs
the windows the server lacks, and only those, into new blocks: each run of
consecutive missing windows, with the `sequence_length - 1` rows before its
first window, cut every `block_length` rows as the writer cuts them. Each
window is then stored once, though the new blocks may be cut elsewhere than
the lost ones. A window whose earlier rows are no longer kept is counted
lost instead. What it cannot know: a stream that gave up and started over
(`writer.StreamWriter`) started its blocks over, which its calls do not
record; a window across that point is made again as if it had been written.
"""

import collections
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np
from tf_agents.trajectories import time_step as ts

from smart_replay.layouts import packed_items
from smart_replay.layouts import protocol
from smart_replay.writing import block_writer

_FIRST, _MID, _LAST = (int(ts.StepType.FIRST), int(ts.StepType.MID),
                       int(ts.StepType.LAST))


class _Gaps:
  """The windows one stream's kept calls make in one table of packed items,
  and the open block of those the server lacks."""

  def __init__(self, config: Any, bytes_per_step: int, *, fresh: bool):
    self.table = config.name
    self._length = config.sequence_length
    self._cross = config.cross_episodes
    # The last rows before the next one, for a window that starts there.
    self._before = collections.deque(maxlen=self._length - 1)
    # Rows since the episode began: a window ends at a row once it is the
    # `sequence_length`-th or later. Calls kept from the middle of a stream
    # take its first row as a window's last (its earlier rows are gone).
    self._rows = 0 if fresh else self._length - 1
    self._open = packed_items.BlockBuilder(config, bytes_per_step)
    self._running = False  # Whether `_open` holds a run of missing windows.
    self.lost = 0  # Missing windows whose earlier rows are gone.

  def add(self, row: np.ndarray, step_type: int, *,
          missing: bool) -> List[packed_items.Block]:
    """One row of the stream; `missing`: the server lacks the window that
    ends at it (if one does). Returns the blocks it completes."""
    done = []
    if step_type == _FIRST and not self._cross:
      done += self.end_episode()
    self._rows += 1
    if self._rows >= self._length and missing:
      if not self._running and len(self._before) == self._length - 1:
        for before in self._before:  # The rows of its first window.
          done += self._open.add(before, _MID)
        self._running = True
      if self._running:
        done += self._open.add(row, _MID)
      else:
        self.lost += 1
    else:
      done += self._close()
    self._before.append(row)
    if step_type == _LAST and not self._cross:
      done += self.end_episode()
    return done

  def end_episode(self) -> List[packed_items.Block]:
    """The stream's episode ended: no window goes on past it (unless the
    table crosses episodes)."""
    if self._cross:
      return []
    self._rows = 0
    self._before.clear()
    return self._close()

  def finish(self) -> List[packed_items.Block]:
    """The last run's block."""
    return self._close()

  def _close(self) -> List[packed_items.Block]:
    if not self._running:
      return []
    self._running = False
    done = self._open.flush()
    self._open.reset()
    return done


class BlockGaps:
  """The windows of a writer's packed tables that a server lacks, made again.

  Args:
    tables: the resolved configs of the writer's tables of packed items.
    layout: the buffer's `protocol.StepLayout`.
    out: a fresh `block_writer.BlockWriter` of those tables.
    num_streams: the writer's streams.
    batched: whether it took batches (`num_envs`).
    is_held: `is_held((stream, table), seq)`: whether the server holds the
      window of that stream and table ending at call `seq`.
    fresh: whether the kept calls begin with the writer's first one.

  Attributes:
    items: blocks made again, per table.
    lost: windows the server lacks whose earlier rows are no longer kept,
      per table.
  """

  def __init__(self, tables: Sequence[Any], *, layout: protocol.StepLayout,
               out: block_writer.BlockWriter, num_streams: int,
               batched: bool,
               is_held: Callable[[Tuple[int, str], int], bool], fresh: bool):
    self._layout, self._out = layout, out
    self._batched, self._is_held = batched, is_held
    self._streams = [[_Gaps(t, layout.block_step_bytes, fresh=fresh)
                      for t in tables] for _ in range(num_streams)]
    self.items: Dict[str, int] = collections.Counter()
    self.lost: Dict[str, int] = collections.Counter()

  def add(self, columns: Sequence[np.ndarray], step_types: np.ndarray,
          seq: int) -> None:
    """A call's step of every stream (a journal's BLOCK_ADD).

    Args:
      columns: the call's columns, as the journal recorded them.
      step_types: its step types, one per stream.
      seq: its record number.

    Raises:
      WaitTimeoutError, ServerUnavailableError, WriteFailedError: as the
        block writer's writes.
    """
    rows = self._layout.block_rows(columns)
    for index, gaps in enumerate(self._streams):
      row = rows[index] if self._batched else rows
      for table in gaps:
        self._write(table.table, table.add(
            row, int(step_types[index]),
            missing=not self._is_held((index, table.table), seq)))

  def end_episode(self) -> None:
    """Every stream's episode ended (a journal's BLOCK_END_EPISODE)."""
    for gaps in self._streams:
      for table in gaps:
        self._write(table.table, table.end_episode())

  def finish(self) -> None:
    """Writes the open blocks and waits until every block is stored.

    Raises:
      WaitTimeoutError, ServerUnavailableError, WriteFailedError: as the
        block writer's writes.
    """
    for gaps in self._streams:
      for table in gaps:
        self._write(table.table, table.finish())
        if table.lost:
          self.lost[table.table] += table.lost
          table.lost = 0
    self._out.flush()

  def _write(self, table: str, blocks: List[packed_items.Block]) -> None:
    for rows, windows in blocks:
      self._out.write_block(table, rows, windows)
      self.items[table] += 1
