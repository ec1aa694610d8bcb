"""Stacked frames rebuilt from stored cells (see `frame_cells`).

`Rebuilder` turns a frame-stacked layout's cells back into packed rows and
whole stacks: inside TensorFlow for the dataset (`window_items` per batch of
per-window items; `blocks_windows` per batch of sampled zstd blocks,
`block_windows` per zlib block), and with numpy for checkpoint readers
(`unpack_item`). zstd is inflated by the compiled op
(`smart_replay.ops.zstd`), zlib by `tf.io.decode_compressed`, so no Python
runs in the sampling pipeline; zstd stacks are gathered by the compiled op
(`smart_replay.ops.stacks`), which interleaves last-axis stacks as it goes.
"""

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tree

from smart_replay.layouts import frame_blobs
from smart_replay.layouts import frame_cells
from smart_replay.layouts import packed_items
from smart_replay.layouts import packed_steps
from smart_replay.ops import stacks
from smart_replay.ops import zstd

_HEADER = frame_blobs.HEADER_BYTES
_GROUP = frame_blobs.GROUP_CELLS


class Rebuilder:
  """Cells back to packed rows and whole stacks.

  `window_items`, `blocks_windows` and `block_windows` run inside
  TensorFlow (`tf.data`); `unpack_item` with numpy (checkpoint readers).

  Args:
    field: the spec's `frame_cells.StackedField`.
    row_bytes: bytes of a packed row (the other fields).
  """

  def __init__(self, field: frame_cells.StackedField, row_bytes: int):
    self._field = field
    self._row_bytes = row_bytes
    self._codec = field.option.codec
    self._empty_group = (frame_blobs.empty_group(row_bytes)
                         if self._codec == 'zstd' else None)

  def _stacks(self, frames: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """Gathers `[..., depth]` frame indices into stacks of the field's
    shape.

    zstd layouts gather with the compiled op, which interleaves last-axis
    stacks as it gathers; zlib layouts (no compiled op needed) gather, then
    transpose last-axis stacks (about 4 ms a batch of 32 windows of 2 Atari
    steps).
    """
    field = self._field
    if self._codec == 'zstd':
      stacked = stacks.gather(frames, index, depth_last=field.last_axis)
      return tf.reshape(stacked, tf.concat(
          [tf.shape(index)[:-1], list(field.shape)], 0))
    stacked = tf.gather(frames, index)
    stacked = tf.reshape(stacked, tf.concat(
        [tf.shape(index), list(field.frame_shape)], 0))
    if field.last_axis:
      rank = index.shape.rank
      order = (list(range(rank - 1)) +  # Batch dims, frame dims, depth.
               list(range(rank, rank + len(field.frame_shape))) + [rank - 1])
      stacked = tf.transpose(stacked, order)
    return stacked

  def _groups(self, blobs: tf.Tensor, cells: int
              ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Groups of `cells` cells each, `[windows, groups]`, inflated and
    parsed.

    Returns:
      `(counts int32[windows, groups * cells], rows uint8[windows, groups *
      cells, row_bytes], frames uint8[total, frame_bytes], offsets
      int32[windows])`: every window's frames one after another in
      `frames`, the first of window w at `offsets[w]`.
    """
    row_bytes, frame_bytes = self._row_bytes, self._field.frame_bytes
    if self._codec == 'zstd':  # One op: inflated straight into tensors.
      return zstd.decode_cells(blobs, cells=cells, row_bytes=row_bytes,
                               frame_bytes=frame_bytes)
    raw = tf.io.decode_compressed(blobs, 'ZLIB')
    windows = tf.shape(raw)[0]
    total = tf.shape(raw)[1] * cells  # Cells per window.
    counts = tf.cast(tf.reshape(tf.io.decode_raw(
        tf.strings.substr(raw, _HEADER, cells), tf.uint8),
                                [windows, total]), tf.int32)
    rows = tf.reshape(tf.io.decode_raw(
        tf.strings.substr(raw, _HEADER + cells, cells * row_bytes),
        tf.uint8), [windows, total, row_bytes])
    head = _HEADER + cells * (1 + row_bytes)
    lengths = tf.strings.length(raw)
    joined = tf.strings.reduce_join(tf.reshape(tf.strings.substr(
        raw, tf.fill(tf.shape(lengths), head), lengths - head), [-1]))
    frames = tf.reshape(tf.io.decode_raw(joined, tf.uint8), [-1, frame_bytes])
    offsets = tf.cumsum(tf.reduce_sum(counts, axis=1), exclusive=True)
    return counts, rows, frames, offsets

  def window_items(self, blobs: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """A batch of per-window items, inside TensorFlow.

    Args:
      blobs: `string[batch, lookback + steps]`, one cell each.

    Returns:
      `(rows uint8[batch, steps, row_bytes], stacks [batch, steps, *field
      shape])`.
    """
    field, lookback = self._field, self._field.lookback
    counts, rows, frames, offsets = self._groups(blobs, 1)
    ends = tf.cumsum(counts, axis=1)[:, lookback:] + offsets[:, None]
    index = ends[..., None] - field.depth + tf.range(field.depth)
    return rows[:, lookback:], self._stacks(frames, index)

  def blocks_windows(self, blobs: tf.Tensor, block_length: int,
                     starts: tf.Tensor, length: int
                     ) -> Tuple[tf.Tensor, tf.Tensor]:
    """Windows cut from a batch of zstd blocks, inside TensorFlow.

    Each window inflates only the groups its cells' stacks lie in: the
    groups from the one holding its first stack's oldest frame to the one
    holding its last cell (the same number for every window; the ones a
    window does not need are replaced by an empty group).

    Args:
      blobs: `string[blocks]`, each a block's container.
      block_length: cells per block.
      starts: `int32[blocks, windows]`, each window's first cell.
      length: steps per window.

    Returns:
      `(rows uint8[blocks * windows, length, row_bytes], stacks [blocks *
      windows, length, *field shape])`, block by block.
    """
    depth = self._field.depth
    groups = frame_blobs.block_groups(block_length)
    # Groups a window's cells (and the depth - 1 before) can touch.
    touched = min(groups, (length + depth - 3) // _GROUP + 2)
    head = frame_blobs.container_header_bytes(groups)
    count_bytes = frame_blobs.container_header_bytes(0)
    ends = tf.io.decode_raw(tf.strings.substr(blobs, count_bytes, 4 * groups),
                            tf.int32, little_endian=True)  # [blocks, groups]
    firsts = head + tf.concat([tf.zeros_like(ends[:, :1]), ends[:, :-1]], 1)
    oldest = tf.maximum(starts - (depth - 1), 0) // _GROUP
    newest = (starts + length - 1) // _GROUP
    first = tf.minimum(oldest, groups - touched)  # [blocks, windows]
    chosen = first[..., None] + tf.range(touched)  # [blocks, windows, touched]
    offsets = tf.gather(firsts, chosen, batch_dims=1)
    sizes = tf.gather(ends + head, chosen, batch_dims=1) - offsets
    parts = tf.strings.substr(
        tf.broadcast_to(blobs[:, None, None], tf.shape(chosen)), offsets,
        sizes)
    needed = (chosen >= oldest[..., None]) & (chosen <= newest[..., None])
    parts = tf.where(needed, parts, self._empty_group)
    counts, rows, frames, offsets = self._groups(
        tf.reshape(parts, [-1, touched]), _GROUP)
    cells = (tf.reshape(starts - first * _GROUP, [-1, 1]) +
             tf.range(length))  # [blocks * windows, length], in the groups.
    ends = tf.gather(tf.cumsum(counts, axis=1), cells, batch_dims=1) + (
        offsets[:, None])
    index = ends[..., None] - depth + tf.range(depth)
    return tf.gather(rows, cells, batch_dims=1), self._stacks(frames, index)

  def block_windows(self, blob: tf.Tensor, block_length: int,
                    starts: tf.Tensor, length: int
                    ) -> Tuple[tf.Tensor, tf.Tensor]:
    """Windows cut from one zlib block, inside TensorFlow.

    Args:
      blob: a block's blob (a scalar string).
      block_length: cells per block.
      starts: `int32[windows]`, each window's first cell.
      length: steps per window.

    Returns:
      `(rows uint8[windows, length, row_bytes], stacks [windows, length,
      *field shape])`.
    """
    field, row_bytes = self._field, self._row_bytes
    raw = tf.io.decode_raw(tf.io.decode_compressed(blob, 'ZLIB'), tf.uint8)
    counts = tf.cast(raw[_HEADER:_HEADER + block_length], tf.int32)
    head = _HEADER + block_length * (1 + row_bytes)
    rows = tf.reshape(raw[_HEADER + block_length:head],
                      [block_length, row_bytes])
    frames = tf.reshape(raw[head:], [-1, field.frame_bytes])
    cells = starts[:, None] + tf.range(length)  # [windows, length]
    ends = tf.gather(tf.cumsum(counts), cells)
    index = ends[..., None] - field.depth + tf.range(field.depth)
    return tf.gather(rows, cells), self._stacks(frames, index)

  def item_rows(self, blobs: np.ndarray, *, block: bool) -> np.ndarray:
    """The packed rows of stored cells, with numpy (no stacks).

    Args:
      blobs: an item's blobs (or some of them): cells of one step each, or
        one block.
      block: whether `blobs` is a block.

    Returns:
      `uint8[cells, row_bytes]`: every cell's row, a block's unused ones
      (zeros) and an item's lookback cells included.

    Raises:
      ValueError: if a blob is damaged.
    """
    blobs = [bytes(b) for b in np.asarray(blobs, object).reshape(-1)]
    return np.concatenate([
        frame_blobs.decode(b, self._row_bytes, self._field.frame_bytes,
                           codec=self._codec, block=block)[1]
        for b in blobs])

  def unpack_item(self, blobs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """A stored item's cells with numpy, for readers.

    Args:
      blobs: the item's blobs: `[lookback + steps]` of one cell each (a
        per-window or episode item), or `[1]` holding a block.

    Returns:
      `(rows [steps, row_bytes], stacks [steps, *field shape])`: every
      cell of a block that holds frames, the steps of an item.

    Raises:
      ValueError: if a blob is damaged, or a stack lacks its earlier frames.
    """
    field = self._field
    blobs = [bytes(b) for b in np.asarray(blobs, object).reshape(-1)]
    block = len(blobs) == 1
    parts = [frame_blobs.decode(b, self._row_bytes, field.frame_bytes,
                                codec=self._codec, block=block)
             for b in blobs]
    counts, rows, frames = (np.concatenate(p) for p in zip(*parts))
    ends = np.cumsum(counts, dtype=np.int64)
    first = 0 if block else field.lookback
    last = int(np.count_nonzero(counts)) if block else len(ends)
    ends = ends[first:last]
    if len(ends) and ends[0] < field.depth:
      raise ValueError(f'a stored item\'s first stack lacks '
                       f'{field.depth - ends[0]} earlier frame(s).')
    index = ends[:, None] - field.depth + np.arange(field.depth)
    stacked = frames[index].view(field.dtype).reshape(
        (len(ends), field.depth) + field.frame_shape)
    return rows[first:last], field.stacks(stacked)


class FrameStackedLayout:
  """The packed layout of a spec with a stacked pixel field.

  Attributes:
    name: 'packed'.
    data_spec: the spec of one step.
    step_spec: `tf.string` scalar: one blob per step.
    num_columns: 1.
    lookback: cells an item references before its first step.
    stacked_field: the `frames.StackedField`.
    rebuilder: the `Rebuilder` of blobs.
    cells: the `frame_cells.Cells` the writers make.
    batches_blocks: whether sampled blocks are cut a batch at a time
      (`cut_blocks`, zstd) or one at a time (`cut_block`, zlib).
    journals_cells: True: a journal records the cells a stream appends
      (the new frames of a step, compressed), not whole stacks.
    rebuilds_on_read: True: decoding inflates frames and rebuilds stacks.
    block_step_bytes: bytes of a step in a block: its packed row, then its
      stack's frames.

  A `protocol.StepLayout`.

  Args:
    data_spec: the spec of one step.
    frame_stack: the `frame_cells.FrameStack` option.

  Raises:
    ValueError: if the option does not fit the spec, or another field does
      not pack (names it).
    ZstdOpMissingError: if the codec is zstd and the op is not built (says
      how to build it).
  """

  name = 'packed'
  num_columns = 1
  journals_cells = True
  rebuilds_on_read = True

  def __init__(self, data_spec: Any, frame_stack: frame_cells.FrameStack, *,
               ids: bool = False):
    self.data_spec = data_spec
    self.writer_ids = bool(ids)
    self.stacked_field = frame_cells.StackedField(frame_stack, data_spec)
    self.batches_blocks = frame_stack.codec == 'zstd'
    if self.batches_blocks:
      try:
        zstd.require()
      except zstd.ZstdOpMissingError as e:
        raise zstd.ZstdOpMissingError(
            f'the frame stack {frame_stack.describe()} stores its frames in '
            f'zstd, which needs our TensorFlow op: {e} (A new buffer can do '
            'without: frame_stack=False stores whole stacks, '
            "FrameStack(..., codec='zlib') the frames in zlib.)") from e
    leaves = tree.flatten(data_spec)
    self._rest = packed_steps.StepCodec(
        [s for i, s in enumerate(leaves) if i != self.stacked_field.index],
        ids=ids)
    self.row_bytes = self._rest.bytes_per_step
    self.rebuilder = Rebuilder(self.stacked_field, self.row_bytes)
    self.cells = frame_cells.Cells(self.stacked_field, self.row_bytes)
    self.lookback = self.stacked_field.lookback
    self.step_spec = tf.TensorSpec([], tf.string, name='frames')
    self.block_step_bytes = self.row_bytes + self.cells.stack_bytes

  def describe(self) -> Dict[str, Any]:
    """The layout as a manifest records it: the packed rows of the other
    fields and `frame_stack`."""
    return {'name': self.name, **self._rest.describe(),
            'frame_stack': self.stacked_field.option.describe()}

  def columns(self, flat_step: Sequence[np.ndarray]) -> List[np.ndarray]:
    """`[rows, frames]` of a step (or a batch of steps): the packed row of
    the other fields and the stack's frames, oldest first; the writer turns
    them into a cell (`frames.CellEncoder`)."""
    index = self.stacked_field.index
    rows = self._rest.pack(flat_step[:index] + flat_step[index + 1:])
    return [rows, self.stacked_field.frames(flat_step[index])]

  def stamp_ids(self, columns: List[np.ndarray], writer_id: int,
                seq: int) -> None:
    """Writes the writer ids into a call's `columns()` rows (in place; see
    `packed_steps.StepCodec.stamp_ids`); nothing without `writer_ids`."""
    if self.writer_ids:
      self._rest.stamp_ids(columns[0], writer_id, seq)

  def read_ids(self, stored: Any, *, block: bool) -> Tuple[
      np.ndarray, np.ndarray, np.ndarray]:
    """The writer ids of stored cells, with numpy (a block's unused cells
    included).

    Args:
      stored: blobs of an item: cells of one step each, or one block.
      block: whether `stored` is a block.

    Returns:
      `(writer_id, stream, seq)` of each step.

    Raises:
      ValueError: without `writer_ids`.
    """
    if not self.writer_ids:
      raise ValueError('this layout stores no writer ids.')
    return self._rest.read_ids(self.rebuilder.item_rows(stored, block=block))

  def encoder(self) -> frame_cells.CellEncoder:
    """A new stream's encoder: each step a cell of its new frames.

    Returns:
      A `frame_cells.CellEncoder`.
    """
    return self.cells.encoder()

  def block_rows(self, columns: Sequence[np.ndarray]) -> np.ndarray:
    """A call's `columns()` as the rows of blocks: each step's packed row,
    then its stack's frames.

    Args:
      columns: `[rows, frames]`, with or without the streams' dimension.

    Returns:
      `uint8[(num_streams,) block_step_bytes]`.
    """
    rows, frames = columns
    lead = rows.shape[:-1]
    return np.concatenate(
        [rows, frames.reshape(lead + (-1,)).view(np.uint8)], axis=-1)

  def block_column(self, rows: np.ndarray, count: int) -> np.ndarray:
    """One block's blob: its rows and the frames new in each step.

    Args:
      rows: `uint8[block_length, block_step_bytes]` (`block_rows`).
      count: the steps the block holds.

    Returns:
      The blob (`frame_cells.Cells.block`).
    """
    return self.cells.block(rows, count)

  def block_windows(self, items: tf.data.Dataset, count: int, *,
                    num_steps: int, per_item: int, block_length: int,
                    drop_remainder: bool) -> tf.data.Dataset:
    """Batches of sampled blocks as their windows, stacks rebuilt: a batch
    at a time (zstd, one op call), or one block at a time (zlib, two in
    parallel).

    Args:
      items: a `reverb.TrajectoryDataset` of a table of packed items.
      count: blocks per batch.
      num_steps: steps per window.
      per_item: windows cut from each block.
      block_length: cells per block.
      drop_remainder: drop the last, partial batch when `items` ends.

    Returns:
      `reverb.ReplaySample`s whose data is `(rows, stacks)` of
      `[count * per_item, num_steps, ...]`.
    """
    if self.batches_blocks:
      # Two batches inflate at once (one op each: the op itself is serial).
      return items.batch(count, drop_remainder).map(
          packed_items.cut_blob_batches(num_steps, per_item, block_length,
                                        self.cut_blocks),
          num_parallel_calls=2)
    return items.map(
        packed_items.cut_blob_windows(num_steps, per_item, block_length,
                                      self.cut_block),
        num_parallel_calls=2).batch(count, drop_remainder).map(
            lambda chunk: tf.nest.map_structure(
                lambda t: tf.reshape(t, [-1] + t.shape[2:].as_list()), chunk))

  def _with_stack(self, rest: Sequence[Any], stack: Any) -> Any:
    flat = list(rest)
    flat.insert(self.stacked_field.index, stack)
    return tree.unflatten_as(self.data_spec, flat)

  def decode(self, stored: Any) -> Any:
    """Stored cells back to the data spec, inside TensorFlow.

    Args:
      stored: `string[batch, lookback + steps]` blobs of per-window items,
        or `(rows, stacks)` already rebuilt (windows cut from blocks).

    Returns:
      A nest like `data_spec` of `[batch, steps, ...]` tensors.
    """
    if isinstance(stored, tuple):
      rows, stacked = stored
    else:
      rows, stacked = self.rebuilder.window_items(stored)
    rest = tree.flatten(self._rest.decode(rows))
    return self._with_stack(rest, stacked)

  def cut_block(self, blob: tf.Tensor, block_length: int, starts: tf.Tensor,
                length: int):
    """Windows cut from a block, inside TensorFlow.

    Args:
      blob: the block's blob (a scalar string).
      block_length: cells per block.
      starts: `int32[windows]`, each window's first cell.
      length: steps per window.

    Returns:
      `(rows, stacks)`, see `Rebuilder.block_windows`.
    """
    return self.rebuilder.block_windows(blob, block_length, starts, length)

  def cut_blocks(self, blobs: tf.Tensor, block_length: int,
                 starts: tf.Tensor, length: int):
    """Windows cut from a batch of zstd blocks, inside TensorFlow.

    Args:
      blobs: `string[blocks]`, the blocks' blobs.
      block_length: cells per block.
      starts: `int32[blocks, windows]`, each window's first cell.
      length: steps per window.

    Returns:
      `(rows, stacks)`, see `Rebuilder.blocks_windows`.
    """
    return self.rebuilder.blocks_windows(blobs, block_length, starts, length)

  def unpack(self, stored: Any) -> Any:
    """A stored item's blobs back to the data spec, with numpy (readers).

    Args:
      stored: the item's blobs: `[lookback + steps]` of one cell each, or
        `[1]` holding a block.

    Returns:
      A nest like `data_spec` of `[steps, ...]` arrays (`[1, cells, ...]`
      for a block, as blocks of packed rows are read).
    """
    block = np.asarray(stored).reshape(-1).shape[0] == 1
    rows, stacked = self.rebuilder.unpack_item(stored)
    rest = tree.flatten(self._rest.unpack(rows))
    if block:
      rest, stacked = [r[None] for r in rest], stacked[None]
    return self._with_stack(rest, stacked)

  def stored_fields(self, columns: Sequence[np.ndarray]) -> List[np.ndarray]:
    """A checkpoint item's blobs back to the spec's fields, with numpy.

    Args:
      columns: `[blobs]` of the item (`unpack`).

    Returns:
      Its fields, flat (`unpack`'s shapes).
    """
    return tree.flatten(self.unpack(columns[0]))
