"""What a dataset yields beside each batch: `ReplayInfo`, and importance weights."""

from typing import Any, NamedTuple

import tensorflow as tf


class ReplayInfo(NamedTuple):
  """What the dataset yields beside each batch of trajectories.

  Every field has shape `[batch, num_steps]` (per-item values are broadcast
  over the steps, as TF-Agents does with `reverb.SampleInfo`), so
  `info.key[:, 0]` are the sampled items' keys. For a table of packed items,
  `key`, `table_size`, `priority` (its window count) and `times_sampled` are
  the sampled block's, and `probability` is the window's.

  Attributes:
    key: uint64 item keys (for `ReplayBufferManager.update_priorities`).
    probability: float64 probability the item had of being sampled.
    table_size: int64 items in the table when it was sampled.
    priority: float64 priority of the item.
    times_sampled: int32 times the item has been sampled, this time included.
    weight: float32 importance-sampling weight `(N * P(i)) ** -beta / max w`
      (max over the batch); 1 for tables that are not prioritized.
    mask: bool, False on the padding steps of episode items shorter than the
      table's `episode_length`; True everywhere else.
    source: int32, where the element was sampled: `ONLINE` (0, the sampled
      table: the buffer's own) or `STARTER` (1, a read-only starter table
      mixed in by `get_dataset(starter_fraction=...)`); the other fields
      (key, probability, table_size, priority) are the source table's.
  """
  key: Any
  probability: Any
  table_size: Any
  priority: Any
  times_sampled: Any
  weight: Any
  mask: Any
  source: Any


ONLINE, STARTER = 0, 1  # ReplayInfo.source values.


def importance_weights(probability: tf.Tensor, table_size: tf.Tensor,
                       beta: Any) -> tf.Tensor:
  """Importance-sampling weights of a batch of prioritized samples.

  Args:
    probability: `[batch]` sampling probabilities P(i).
    table_size: `[batch]` table sizes N when each item was sampled.
    beta: the exponent, a scalar in [0, 1].

  Returns:
    float32 `[batch]` weights `w_i = (N * P(i)) ** -beta / max_j w_j`.
  """
  weights = raw_importance_weights(probability, table_size, beta)
  return tf.cast(weights / tf.reduce_max(weights), tf.float32)


def raw_importance_weights(probability: tf.Tensor, table_size: tf.Tensor,
                           beta: Any) -> tf.Tensor:
  """Unnormalized importance-sampling weights `(N * P(i)) ** -beta`.

  Args:
    probability: `[batch]` sampling probabilities P(i).
    table_size: `[batch]` table sizes N when each item was sampled.
    beta: the exponent, a scalar in [0, 1].

  Returns:
    float64 `[batch]` weights.
  """
  scaled = tf.cast(table_size, tf.float64) * tf.cast(probability, tf.float64)
  return tf.pow(scaled, -tf.cast(beta, tf.float64))
