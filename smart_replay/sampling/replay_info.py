"""What a dataset yields beside each batch: `ReplayInfo`, importance weights."""

from typing import Any, Callable, NamedTuple, Optional, Sequence

import tensorflow as tf

from smart_replay.config import tables as tables_lib


class ReplayInfo(NamedTuple):
  """What the dataset yields beside each batch of trajectories.

  Every field has shape `[batch, num_steps]` (per-item values are broadcast
  over the steps, as TF-Agents does with `reverb.SampleInfo`), so
  `info.key[:, 0]` are the sampled items' keys. `probability` and
  `table_size` are those of the buffer the element came from, as one table
  would have them: a sharded buffer's over all its shards. For a table of
  packed items, `key`, `priority` (its window count) and `times_sampled`
  are the sampled block's, and `probability` is the window's.

  Attributes:
    key: uint64 item keys (for `ReplayBufferManager.update_priorities`).
    probability: float64 probability the element had of being sampled from
      its buffer.
    table_size: int64 items in its buffer when it was sampled.
    priority: float64 priority of the item.
    times_sampled: int32 times the item has been sampled, this time included.
    weight: float32 importance-sampling weight `(N * P(i)) ** -beta / max w`
      over its buffer (N its `table_size`, P(i) its `probability`; max over
      the batch's elements of the same buffer); 1 for tables that are not
      prioritized.
    mask: bool, False on the padding steps of episode items shorter than the
      table's `episode_length`; True everywhere else.
    source: int32, the buffer the element was sampled from: `ONLINE` (0, the
      manager's own) or `STARTER` (1, a read-only starter table mixed in by
      `get_dataset(starter_fraction=...)`).
    shard: int32, the shard of a sharded buffer that holds the item (where
      `update_priorities(shards=...)` sets its priority); 0 for one server.
  """
  key: Any
  probability: Any
  table_size: Any
  priority: Any
  times_sampled: Any
  weight: Any
  mask: Any
  source: Any
  shard: Any


ONLINE, STARTER = 0, 1  # ReplayInfo.source values.


def importance_weights(probability: tf.Tensor, size: tf.Tensor,
                       source: tf.Tensor,
                       betas: Sequence[Optional[Callable[[], Any]]]
                       ) -> tf.Tensor:
  """Importance-sampling weights of a batch, per buffer.

  Args:
    probability: `[batch]` probabilities P(i) of each element in its buffer.
    size: `[batch]` its buffer's size N when it was sampled.
    source: int32 `[batch]`, its buffer (an index into `betas`).
    betas: per buffer, a callable returning the exponent beta (read once
      per batch, so it can follow the train step), or None for weights of 1.

  Returns:
    float32 `[batch]` weights `w_i = (N * P(i)) ** -beta / max_j w_j`, the
    max over the elements of the same buffer.
  """
  scaled = tf.cast(size, tf.float64) * tf.cast(probability, tf.float64)
  ones = tf.ones_like(scaled)
  raw = ones
  for index, beta in enumerate(betas):
    if beta is not None:
      raw = tf.where(tf.equal(source, index),
                     tf.pow(scaled, -tf.cast(beta(), tf.float64)), raw)
  largest = tf.math.unsorted_segment_max(raw, source, len(betas))
  return tf.cast(raw / tf.gather(largest, source), tf.float32)


def beta(config: tables_lib.TableConfig, train_step: Optional[tf.Variable]
         ) -> Optional[Callable[[], Any]]:
  """The importance-sampling beta of `config`, as the dataset reads it.

  Args:
    config: the sampled table's config.
    train_step: the train-step variable; needed when beta is annealed.

  Returns:
    None for tables that are not prioritized (weights of 1); else a callable
    returning beta, annealed linearly from `importance_beta` to
    `importance_beta_final` over `importance_beta_steps` train steps.

  Raises:
    ValueError: if beta is annealed and `train_step` is not a variable.
  """
  if not config.prioritized:
    return None
  start = config.importance_beta
  if config.importance_beta_final is None:
    return lambda: start
  if not isinstance(train_step, tf.Variable):
    raise ValueError(
        f'table {config.name!r} anneals importance_beta from {start} to '
        f'{config.importance_beta_final} over '
        f'{config.importance_beta_steps} train steps; pass the train step '
        f'variable as get_dataset(train_step=...), got {train_step!r}.')
  final, steps = config.importance_beta_final, config.importance_beta_steps
  def annealed():
    progress = tf.minimum(tf.constant(1.0, tf.float64),
                          tf.cast(train_step, tf.float64) / steps)
    return start + (final - start) * progress
  return annealed
