"""What sampled items become: windows of `num_steps` steps, a chunk at a time.

Every source of a dataset turns the items Reverb samples into *windows*, the
unit a batch is made of, in this one place:

* a sequence item of L steps is one window, or `L // num_steps` windows of
  `num_steps` steps (`num_steps` must divide L; each keeps the item's info);
* an episode item of up to L steps is padded to L (`mask` False on the
  padding);
* a block of packed items (`layouts.packed_items`) gives `windows_per_item`
  windows, each uniform among the block's, with the window's probability;
  the layout cuts them (`StepLayout.block_windows`: packed rows in one
  gather; a frame stack's blocks rebuilt, zstd a chunk at a time, zlib one
  inflate per block);
* a frame-stacked layout's other items keep their cells (the stacks are
  rebuilt once per batch, `StepLayout.decode`).

A window is `(data, info, mask)`: the stored steps (`[num_steps, ...]`, with
`lookback` cells before them for frame stacks), Reverb's `SampleInfo` and a
bool `[num_steps]` mask. `chunks` makes them in chunks of a fixed number of
windows, so that per-item work is done once per chunk.
"""

from typing import Any, NamedTuple, Optional

import reverb
import tensorflow as tf

from smart_replay.config import tables as tables_lib
from smart_replay.layouts import protocol


class Window(NamedTuple):
  """One window, or a chunk of them (leading dimension).

  Attributes:
    data: the stored steps, a nest like the layout's `step_spec` with the
      time dimension (`[num_steps + lookback, ...]`), or `(rows, stacks)`
      already rebuilt from a frame-stacked block.
    info: Reverb's `SampleInfo` of the window (a block's probability divided
      by the windows it holds).
    mask: bool `[num_steps]`, False on the padding of episode items.
  """
  data: Any
  info: Any
  mask: Any


class Windows:
  """How one table's sampled items become windows.

  Args:
    table: the table's resolved `TableConfig`.
    layout: the buffer's layout (`step_spec`, `lookback`, and `cut_block`
      of a frame-stacked layout).
    num_steps: steps per window; None: the whole item.

  Attributes:
    num_steps: steps per window.
    per_item: windows each sampled item gives.
    dtypes, shapes: what `reverb.TrajectoryDataset` is asked for.

  Raises:
    ValueError: if `num_steps` is not a positive divisor of the item length,
      or not the item length where items are sampled whole (episodes,
      packed items, frame stacks); names the value.
  """

  def __init__(self, table: tables_lib.TableConfig,
               layout: protocol.StepLayout, num_steps: Optional[int]):
    length = table.item_length
    num_steps = length if num_steps is None else num_steps
    if (isinstance(num_steps, bool) or not isinstance(num_steps, int) or
        num_steps < 1 or length % num_steps):
      named = ('sequence_length' if table.kind == 'sequence' else
               'episode_length')
      raise ValueError(
          f'num_steps={num_steps!r} must be a positive divisor of table '
          f'{table.name!r}\'s {named}={length} (items hold {length} steps; '
          'other lengths would silently drop steps).')
    whole = {'episode items': table.kind == 'episode',
             'packed items': table.block_length is not None,
             'frame-stacked items': bool(layout.lookback)}
    for what, sampled_whole in whole.items():
      if sampled_whole and num_steps != length:
        raise ValueError(
            f'num_steps={num_steps!r}: table {table.name!r} holds {what}, '
            f'sampled as whole windows of {length} steps; pass '
            f'num_steps=None or {length}.')
    self.table = table
    self.num_steps = num_steps
    self._layout = layout
    self._variable = table.kind == 'episode'
    self._blocks = table.block_length is not None
    self._pieces = length // num_steps
    self.per_item = table.windows_per_item if self._blocks else self._pieces
    self.dtypes, self.shapes = self._signature()

  def _signature(self):
    """`(dtypes, shapes)` of the table's items, time dimension first."""
    spec, lookback = self._layout.step_spec, self._layout.lookback
    length = None if self._variable else self.table.item_length + lookback
    shapes = tf.nest.map_structure(
        lambda s: tf.TensorShape([length] + s.shape.as_list()), spec)
    if self._blocks:  # One step per item: a block of packed steps.
      shapes = tf.TensorShape([1] + ([] if spec.dtype == tf.string else
                                     [self.table.block_length]) +
                              spec.shape.as_list())
    return tf.nest.map_structure(lambda s: s.dtype, spec), shapes

  def items_for(self, windows: int) -> int:
    """Items that give at least `windows` windows."""
    return -(-windows // self.per_item)

  def chunks(self, items: tf.data.Dataset, windows: int, *,
             drop_remainder: bool = True) -> tf.data.Dataset:
    """Chunks of `windows` windows from a stream of sampled items.

    Args:
      items: a `reverb.TrajectoryDataset` of this table (`ReplaySample`s).
      windows: windows per chunk (a block's extra windows are dropped).
      drop_remainder: drop the last, partial chunk when the stream ends;
        False keeps it (tables that delete sampled items).

    Returns:
      A dataset of `Window`s with a leading dimension of `windows` (at most
      that many when `drop_remainder` is False).
    """
    count = self.items_for(windows)
    if self._variable:  # Padded one by one, then batched.
      chunks = items.map(self._pad).batch(count, drop_remainder)
    elif self._blocks:  # The layout cuts its blocks.
      chunks = self._layout.block_windows(
          items, count, num_steps=self.num_steps, per_item=self.per_item,
          block_length=self.table.block_length,
          drop_remainder=drop_remainder).map(
              lambda cut: self._whole(cut.data, cut.info))
    else:
      chunks = items.batch(count, drop_remainder).map(self._split)
    if count * self.per_item != windows:
      chunks = chunks.map(lambda w: tf.nest.map_structure(
          lambda t: t[:windows], w))
    return chunks

  def _pad(self, sample: reverb.ReplaySample) -> Window:
    """An episode item padded to the item length, with its mask."""
    length, lookback = self.table.item_length, self._layout.lookback
    steps = tf.shape(tf.nest.flatten(sample.data)[0])[0] - lookback
    def pad(t):
      if t.dtype == tf.string:  # Cells: the last one again (masked).
        padded = tf.concat([t, tf.repeat(t[-1:], length - steps, 0)], 0)
      else:
        padded = tf.pad(t, [[0, length - steps]] +
                        [[0, 0]] * (t.shape.rank - 1))
      return tf.ensure_shape(padded, [length + lookback] +
                             t.shape[1:].as_list())
    return Window(tf.nest.map_structure(pad, sample.data), sample.info,
                  tf.sequence_mask(steps, length))

  def _split(self, chunk: reverb.ReplaySample) -> Window:
    """A chunk of sequence items as windows of `num_steps` steps."""
    pieces, steps = self._pieces, self.num_steps
    data, info = chunk.data, chunk.info  # Whole items (with any lookback).
    if pieces > 1:
      data = tf.nest.map_structure(
          lambda t: tf.reshape(t, [-1, steps] + t.shape[2:].as_list()), data)
      info = tf.nest.map_structure(lambda t: tf.repeat(t, pieces), info)
    return self._whole(data, info)

  def _whole(self, data: Any, info: Any) -> Window:
    """Windows of `num_steps` stored steps each (none padded)."""
    return Window(data, info, tf.ones([tf.shape(info.key)[0], self.num_steps],
                                      tf.bool))
