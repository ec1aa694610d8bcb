"""What one sampled Reverb item becomes before it joins a batch.

The pieces `dataset.make_dataset` and `mixing` share: the dtypes and
shapes `reverb.TrajectoryDataset` is asked for, the padding (with a mask) of
variable-length episode items, and the splitting of an item into several
samples of `num_steps` steps.
"""

from typing import Any, Optional, Tuple

import reverb
import tensorflow as tf


def signature(data_spec: Any, sequence_length: int, *,
              variable_length: bool = False,
              blocks: Optional[Tuple[int, int]] = None, lookback: int = 0):
  """`(dtypes, shapes)` of a table's items, for `reverb.TrajectoryDataset`.

  Args:
    data_spec: the spec of one stored step.
    sequence_length: steps per item (the longest, for episode items).
    variable_length: items of up to `sequence_length` steps.
    blocks: `(block_length, windows_per_item)` of packed items, or None.
    lookback: steps an item holds before its first (frame-stacked layouts).

  Returns:
    Nests of dtypes and `TensorShape`s with the time dimension first.
  """
  stored_length = None if variable_length else sequence_length + lookback
  shapes = tf.nest.map_structure(
      lambda s: tf.TensorShape([stored_length] + s.shape.as_list()), data_spec)
  if blocks is not None:  # One step per item: a block of packed steps.
    shapes = tf.TensorShape([1] + ([] if data_spec.dtype == tf.string else
                                   [blocks[0]]) + data_spec.shape.as_list())
  return tf.nest.map_structure(lambda s: s.dtype, data_spec), shapes


def pad(sample: reverb.ReplaySample, sequence_length: int,
        lookback: int = 0):
  """Pads a variable-length item to `sequence_length` steps, with a mask.

  Args:
    sample: one sampled item.
    sequence_length: the length to pad to.
    lookback: steps the item holds before its first (frame-stacked layouts:
      its blobs are padded with copies of the last one, masked False).

  Returns:
    `(data, info, mask)` with `mask` False on the padding steps.
  """
  length = tf.shape(tf.nest.flatten(sample.data)[0])[0] - lookback
  def pad_leaf(t):
    if t.dtype == tf.string:  # Blobs of frames: the last one again (masked).
      padded = tf.concat([t, tf.repeat(t[-1:], sequence_length - length, 0)],
                         0)
    else:
      padded = tf.pad(t, [[0, sequence_length - length]] +
                      [[0, 0]] * (t.shape.rank - 1))
    return tf.ensure_shape(padded, [sequence_length + lookback] +
                           t.shape[1:].as_list())
  mask = tf.sequence_mask(length, sequence_length)
  return tf.nest.map_structure(pad_leaf, sample.data), sample.info, mask


def split(sample: reverb.ReplaySample, pieces: int, num_steps: int
               ) -> reverb.ReplaySample:
  """Splits an item into `pieces` samples of `num_steps` steps.

  Args:
    sample: one sampled item of `pieces * num_steps` steps.
    pieces: samples to cut it into.
    num_steps: steps per sample.

  Returns:
    A `ReplaySample` with a leading dimension of `pieces` (its info
    repeated).
  """
  data = tf.nest.map_structure(
      lambda t: tf.reshape(t, [pieces, num_steps] + t.shape[1:].as_list()),
      sample.data)
  info = tf.nest.map_structure(lambda t: tf.fill([pieces], t), sample.info)
  return reverb.ReplaySample(info=info, data=data)
