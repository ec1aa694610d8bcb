"""Batches sampled from a buffer sharded over several Reverb servers.

One table of the same config lives on each shard (a server). An element is
drawn from shard `s` with probability `mass_s / sum(mass)`, then from that
shard's table by its own sampler, so every item is sampled as one big table
would sample it:

* uniform tables: `mass_s` is the shard's size, so P(i) = 1 / N;
* prioritized tables: `mass_s` is the shard's sum of `p ** alpha`, so
  P(i) = p_i ** alpha / sum over all shards.

The masses are read from what each shard's samples carry (Reverb's
`SampleInfo`: `table_size`, and `priority ** alpha / probability` for the
sum), kept in variables that every sampled item refreshes, and start from
the sizes the servers report when the dataset is made. Importance weights
are computed over the whole buffer, `(N * P(i)) ** -beta` with N the total
size and P(i) the probability above, normalized by the batch's largest.
`ReplayInfo.source` is the shard each element came from, which is where its
priority must be updated (`update_priorities`).
"""

from typing import Any, Callable, Optional, Sequence

import numpy as np
import reverb
import tensorflow as tf

from smart_replay.config import mixable
from smart_replay.sampling import dataset as dataset_lib
from smart_replay.sampling import mixing
from smart_replay.sampling import priorities as priorities_lib
from smart_replay.utils import checks


def sharded_dataset(shards: Sequence[mixing.Source], *, data_spec: Any,
                    train_step: Optional[tf.Variable], batch_size: int,
                    num_steps: Optional[int] = None,
                    decode: Optional[Callable[[Any], Any]] = None,
                    as_train_kwargs: bool = False, timeout_s: float = 60.0,
                    prefetch: int = 2,
                    sizes: Optional[Sequence[int]] = None) -> tf.data.Dataset:
  """A dataset of batches over every shard (module docstring).

  Args:
    shards: one `mixing.Source` per shard (client, its table's config, the
      importance exponent).
    data_spec: the spec of one stored step.
    train_step: the train-step variable (for an annealed beta).
    batch_size: elements per batch.
    num_steps: steps per sample; a divisor of the item length.
    decode: turns a batch of stored steps into the Learner's nest.
    as_train_kwargs: yield `(dict(experience=..., weights=w), info)`.
    timeout_s: how long a shard's stream may wait for a sample before the
      iterator raises (naming that shard's table and server).
    prefetch: batches to prefetch.
    sizes: each shard's current number of items (the masses' start); None
      asks each server.

  Returns:
    A dataset of `(trajectory, ReplayInfo)` batches with `ReplayInfo.source`
    the shard index of each element.

  Raises:
    ValueError: if an argument is invalid (names it and its value), or the
      shards' tables differ or cannot be drawn from together
      (`mixable.check_shards`).
  """
  checks.positive('batch_size', batch_size, integer=True)
  checks.positive('timeout_s', timeout_s)
  if len(shards) < 1:
    raise ValueError(f'shards must hold at least one shard, got {shards!r}.')
  mixable.check_shards([side.config for side in shards])
  config = shards[0].config
  length, variable = config.item_length, config.kind == 'episode'
  num_steps = mixing.check_num_steps(num_steps, length, variable)
  if sizes is None:
    sizes = [_size(s.client, s.config.name, timeout_s) for s in shards]
  start = np.maximum(np.asarray(sizes, np.float64), 1.0)
  table_sizes = tf.Variable(start, trainable=False, name='shard_sizes')
  masses = tf.Variable(start, trainable=False, name='shard_masses')
  alpha = (float(config.priority_exponent) if config.sampler == 'prioritized'
           else None)

  streams = [mixing.item_stream(side, data_spec, length, num_steps, variable,
                                batch_size, timeout_s, index)
             for index, side in enumerate(shards)]
  # The shard of each element, drawn from the masses as they stand; the
  # weights are made once per batch, not once per element. (Batching each
  # shard's stream and taking a multinomial share of each batch was faster
  # with 2 shards, 20k against 14k windows/s, but slower with 4, 8k against
  # 10k: it samples a whole batch from every shard.)
  choices = tf.data.Dataset.from_tensors(0).repeat().map(
      lambda _: tf.repeat(tf.cast(masses / tf.reduce_sum(masses),
                                  tf.float32)[None], batch_size, 0)).unbatch()
  mixed = tf.data.Dataset.sample_from_datasets(streams, weights=choices,
                                               stop_on_empty_dataset=True)
  beta, count = shards[0].beta, len(shards)

  def observe(info, source):
    """Refreshes each sampled shard's size and mass from what its samples
    carry (one SampleInfo per element); a shard absent from the batch keeps
    its values."""
    size = tf.cast(info.table_size, tf.float64)
    mass = size if alpha is None else (
        tf.pow(tf.cast(info.priority, tf.float64), alpha)
        / tf.cast(info.probability, tf.float64))
    seen = tf.math.unsorted_segment_max(tf.ones_like(size), source, count) > 0
    return [held.assign(tf.where(
        seen, tf.math.unsorted_segment_max(value, source, count), held))
            for held, value in ((table_sizes, size), (masses, mass))]

  def finish(data, info, mask, source):
    with tf.control_dependencies(observe(info, source)):
      source = tf.identity(source)
    if beta is None:
      weight = tf.ones_like(info.probability, tf.float32)
    else:
      share = tf.gather(masses / tf.reduce_sum(masses), source)
      probability = share * tf.cast(info.probability, tf.float64)
      weight = dataset_lib.importance_weights(
          probability, tf.reduce_sum(table_sizes), beta())
    return dataset_lib.batch_output(data, info, mask, weight, source,
                                    decode=decode,
                                    as_train_kwargs=as_train_kwargs)

  return mixed.batch(batch_size, drop_remainder=True).map(finish).prefetch(
      prefetch)


def _size(client: reverb.Client, table: str, timeout_s: float) -> int:
  """The number of items in `table` on `client`'s server."""
  return int(client.server_info(timeout=max(1, int(timeout_s)))[
      table].current_size)


def update_priorities(tf_clients: Sequence[reverb.TFClient], config: Any,
                      keys: Any, priorities: Any, shards: Any, *,
                      priorities_of: priorities_lib.Priorities,
                      serving: tf.Variable, where: Sequence[str]) -> None:
  """Sets sampled items' priorities on the shards that hold them.

  Args:
    tf_clients: one `reverb.TFClient` per shard.
    config: the prioritized table's `TableConfig`.
    keys: uint64 item keys `[batch]` (or `[batch, num_steps]`).
    priorities: `[batch]` new priorities.
    shards: int32 `[batch]` (or `[batch, num_steps]`) shard of each key, as
      `ReplayInfo.source` gives it.
    priorities_of: the buffer's `priorities.Priorities`: one largest
      priority over all shards, as one big table would keep.
    serving: False once the buffer stopped (a traced update then fails).
    where: each shard's address, for messages.
  """
  if not tf.is_tensor(keys):  # Python ints above 2**63 need uint64 first.
    keys = np.asarray(keys, np.uint64)
  shards = tf.convert_to_tensor(shards)
  keys = tf.convert_to_tensor(keys)
  priorities = tf.convert_to_tensor(priorities)
  if shards.shape.rank == 2:
    shards = shards[:, 0]
  if keys.shape.rank == 2:
    keys = keys[:, 0]
  for index, client in enumerate(tf_clients):
    mine = tf.equal(shards, index)
    priorities_of.update(client, config, tf.boolean_mask(keys, mine),
                         tf.boolean_mask(priorities, mine), serving=serving,
                         where=where[index])
