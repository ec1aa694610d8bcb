"""Stacked frames rebuilt from stored cells (see `frames`).

`Rebuilder` turns a frame-stacked layout's cells back into packed rows and
whole stacks: inside TensorFlow for the dataset (`window_items` per batch of
per-window items, `block_windows` per sampled block; zlib is inflated by
`tf.io.decode_compressed`, so no Python runs in the sampling pipeline), and
with numpy for checkpoint readers (`unpack_item`).
"""

from typing import Tuple

import numpy as np
import tensorflow as tf

from smart_replay.spec import frames as frames_lib

_HEADER = frames_lib.HEADER_BYTES


class Rebuilder:
  """Cells back to packed rows and whole stacks.

  `window_items` and `block_windows` run inside TensorFlow (`tf.data`);
  `unpack_item` with numpy (checkpoint readers).

  Args:
    field: the spec's `frames_lib.StackedField`.
    row_bytes: bytes of a packed row (the other fields).
  """

  def __init__(self, field: frames_lib.StackedField, row_bytes: int):
    self._field = field
    self._row_bytes = row_bytes

  def _stacks(self, frames: tf.Tensor, index: tf.Tensor,
              batch_dims: int) -> tf.Tensor:
    """Gathers `[..., depth]` frame indices into stacks of the field's
    shape."""
    field = self._field
    stacked = tf.gather(frames, index, batch_dims=batch_dims)
    stacked = tf.reshape(stacked, tf.concat(
        [tf.shape(index), list(field.frame_shape)], 0))
    if field.last_axis:
      rank = index.shape.rank
      order = (list(range(rank - 1)) +  # Batch dims, frame dims, depth.
               list(range(rank, rank + len(field.frame_shape))) + [rank - 1])
      stacked = tf.transpose(stacked, order)
    return stacked

  def window_items(self, blobs: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """A batch of per-window items, inside TensorFlow.

    Args:
      blobs: `string[batch, lookback + steps]`, one cell each.

    Returns:
      `(rows uint8[batch, steps, row_bytes], stacks [batch, steps, *field
      shape])`.
    """
    field, row_bytes = self._field, self._row_bytes
    lookback = field.lookback
    cells = blobs.shape[1]
    raw = tf.io.decode_compressed(blobs, 'ZLIB')
    counts = tf.cast(tf.io.decode_raw(tf.strings.substr(raw, _HEADER, 1),
                                      tf.uint8)[..., 0], tf.int32)
    rows = tf.io.decode_raw(tf.strings.substr(raw[:, lookback:], _HEADER + 1,
                                              row_bytes), tf.uint8)
    head = _HEADER + 1 + row_bytes
    lengths = tf.strings.length(raw)
    joined = tf.strings.reduce_join(tf.strings.substr(
        raw, tf.fill(tf.shape(lengths), head), lengths - head), axis=1)
    frames = tf.reshape(tf.io.decode_raw(
        joined, tf.uint8, fixed_length=cells * field.depth * field.frame_bytes),
                        [-1, cells * field.depth, field.frame_bytes])
    ends = tf.cumsum(counts, axis=1)[:, lookback:]
    index = ends[..., None] - field.depth + tf.range(field.depth)
    return tf.reshape(rows, [-1, cells - lookback, row_bytes]), self._stacks(
        frames, index, 1)

  def block_windows(self, blob: tf.Tensor, block_length: int,
                    starts: tf.Tensor, length: int
                    ) -> Tuple[tf.Tensor, tf.Tensor]:
    """Windows cut from one block, inside TensorFlow.

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
    return tf.gather(rows, cells), self._stacks(frames, index, 0)

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
    parts = [frames_lib.decode(b, self._row_bytes, field.frame_bytes)
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
