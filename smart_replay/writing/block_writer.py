"""Writes the blocks of tables of packed items (`layouts.packed_items`).

One Reverb writer serves every stream of an observer: each block is one step
and one item of its own (its priority the windows it holds), so blocks of
different streams never mix.
"""

import dataclasses
from typing import Any, Sequence

import numpy as np

from smart_replay.config import reverb_tables
from smart_replay.layouts import packed_items
from smart_replay.layouts import packed_steps
from smart_replay.layouts import protocol
from smart_replay.spec import specs
from smart_replay.writing import settings as settings_lib
from smart_replay.writing import writer as writer_lib


class BlockWriter:
  """Writes the blocks of every table of packed items, for every stream.

  One Reverb writer serves all streams: each block is one step and one item
  of its own, so blocks of different streams never mix.

  Args:
    tables: the resolved configs of the tables of packed items.
    settings: the observer's `WriterSettings` (client, timeouts, counters);
      its chunking, encoder and signatures are replaced by the blocks' own.
    layout: the buffer's `protocol.StepLayout` (it makes each block's rows
      and what Reverb stores of them).
    num_streams: environments per observer call (1 when unbatched).
  """

  def __init__(self, tables: Sequence[Any], *,
               settings: settings_lib.WriterSettings,
               layout: protocol.StepLayout, num_streams: int):
    self._counters = settings.counters
    self._out = writer_lib.StreamWriter(dataclasses.replace(
        settings, chunk_length=1, keep_alive=1, clear_at_episode_end=True,
        num_columns=1, encoder=packed_steps.WholeSteps, lookback=0,
        signatures={t.name: specs.describe_signature(reverb_tables.signature(
            t, layout.step_spec)) for t in tables}))
    self._layout = layout
    self._streams = [[packed_items.BlockBuilder(t, layout.block_step_bytes)
                      for t in tables] for _ in range(num_streams)]
    self._out.on_restart = self.reset
    self._tables = [t.name for t in tables]  # The order of each stream's.
    self._lengths = {t.name: t.sequence_length for t in tables}

  def add(self, columns: Sequence[np.ndarray], step_types: Any, *,
          batched: bool) -> None:
    """Adds one step of every stream; writes the blocks it completes.

    Args:
      columns: the layout's columns of the step (`StepLayout.columns`),
        with the streams' dimension when `batched`.
      step_types: the step type(s), a scalar or `[num_streams]`.
      batched: whether `columns` have the streams' dimension.

    Raises:
      WaitTimeoutError, ServerUnavailableError, WriteFailedError: see
        `writer.StreamWriter`.
    """
    rows = self._layout.block_rows(columns)
    if not batched:
      self._write(b.add(rows, int(step_types)) for b in self._streams[0])
      return
    for index, builders in enumerate(self._streams):
      self._write(b.add(rows[index], int(step_types[index])) for b in builders)

  def end_episode(self) -> None:
    """Completes every stream's open blocks of tables that do not cross
    episodes."""
    for builders in self._streams:
      self._write(b.end_episode() for b in builders)

  def flush(self) -> None:
    """Completes the open blocks and waits until every block is stored.

    Raises:
      WaitTimeoutError, ServerUnavailableError, WriteFailedError: see
        `writer.StreamWriter`.
    """
    for builders in self._streams:
      self._write(b.flush() for b in builders)
    self._out.flush()

  def reset(self) -> None:
    """Forgets every open block (the writer started over)."""
    for builders in self._streams:
      for builder in builders:
        builder.reset()

  def close(self) -> None:
    """Closes the Reverb writer at once (call `flush()` first)."""
    self._out.close()

  def write_block(self, table: str, rows: np.ndarray, windows: int) -> None:
    """Writes one complete block as an item of `table`.

    Args:
      table: a table of packed items this writer writes.
      rows: `uint8[block_length, block_step_bytes]`, the block's rows (the
        unused ones zero).
      windows: the windows it holds (its priority).

    Raises:
      WaitTimeoutError, ServerUnavailableError, WriteFailedError: see
        `writer.StreamWriter`.
    """
    self._out.append([self._layout.block_column(
        rows, windows + self._lengths[table] - 1)])
    self._out.defer(table, float(windows), 1)
    self._out.end_chunk()
    self._counters.items[table] += 1

  def _write(self, per_table: Any) -> None:
    for table, blocks in zip(self._tables, per_table):
      for rows, windows in blocks:
        self.write_block(table, rows, windows)
