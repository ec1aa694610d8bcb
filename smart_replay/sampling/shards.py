"""Batches sampled from a buffer sharded over several Reverb servers.

One table of the same config lives on each shard (a server). An element is
drawn from shard `s` with probability `mass_s / sum(mass)`, then from that
shard's table by its own sampler, so every item is sampled as one big table
would sample it:

* uniform tables: `mass_s` is the shard's size, so P(i) = 1 / N;
* prioritized tables: `mass_s` is the shard's sum of `p ** alpha`, so
  P(i) = p_i ** alpha / sum over all shards.

Each batch draws how many of its elements come from each shard at once (a
multinomial over the masses, the same distribution as one draw per element).
The masses are read from what each shard's samples carry (Reverb's
`SampleInfo`: `table_size`, and `priority ** alpha / probability` for the
sum), refreshed by every batch, and start from the sizes the servers report
when the dataset is made. Each shard is sampled by its own thread
(`shard_feeds`), and the batches reach `tf.data` through a queue that a
thread of the dataset fills from the moment it is made (`BatchPump`), so no
`tf.data` thread runs Python. A shard that stops answering gets no share
until it is back (with a new stream), so sampling goes on from the others.
Importance weights are computed over the whole buffer, `(N * P(i)) ** -beta`
with N the total size and P(i) the probability above, normalized by the
batch's largest.
`ReplayInfo.source` is the shard each element came from, which is where its
priority must be updated (`update_priorities`).
"""

import functools
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import reverb
import tensorflow as tf

from smart_replay import errors
from smart_replay.config import mixable
from smart_replay.sampling import dataset as dataset_lib
from smart_replay.sampling import mixing
from smart_replay.sampling import priorities as priorities_lib
from smart_replay.sampling import shard_feeds
from smart_replay.server import control as control_lib
from smart_replay.server import control_access
from smart_replay.utils import checks


def sharded_dataset(shards: Sequence[mixing.Source], *, data_spec: Any,
                    train_step: Optional[tf.Variable], batch_size: int,
                    num_steps: Optional[int] = None,
                    decode: Optional[Callable[[Any], Any]] = None,
                    as_train_kwargs: bool = False, timeout_s: float = 60.0,
                    prefetch: int = 2,
                    sizes: Optional[Sequence[int]] = None,
                    probe: Optional[shard_feeds.Probe] = None,
                    check_s: float = 0.5,
                    seed: Optional[int] = None,
                    on_start: Optional[Callable[[shard_feeds.BatchPump],
                                                None]] = None
                    ) -> tf.data.Dataset:
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
      iterator raises (naming that shard's table and server), and how long
      a batch waits while every shard is down.
    prefetch: batches to prefetch.
    sizes: each shard's current number of items (the masses' start); None
      asks each server.
    probe: asks shard k whether it is up (`shard_feeds.Probe`); None: asks
      its Reverb server (`reverb_probe`).
    check_s: seconds between two probes of every shard.
    seed: seeds the draw of shards (None: fresh entropy).
    on_start: called with the dataset's `shard_feeds.BatchPump` before its
      threads start (e.g. to report which shards are up, and to close it
      with the buffer); it may raise to refuse it.

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
  checks.positive('check_s', check_s)
  if len(shards) < 1:
    raise ValueError(f'shards must hold at least one shard, got {shards!r}.')
  mixable.check_shards([side.config for side in shards])
  config = shards[0].config
  length, variable = config.item_length, config.kind == 'episode'
  num_steps = mixing.check_num_steps(num_steps, length, variable)
  where = [side.client.server_address for side in shards]
  if sizes is None:
    sizes = [_size(s.client, s.config.name, timeout_s) for s in shards]
  start = np.maximum(np.asarray(sizes, np.float64), 1.0)
  alpha = (float(config.priority_exponent) if config.sampler == 'prioritized'
           else None)
  streams = [functools.partial(
      lambda side, index: mixing.item_stream(
          side, data_spec, length, num_steps, variable, batch_size,
          timeout_s, index).batch(batch_size).prefetch(1), side, index)
             for index, side in enumerate(shards)]
  chunk_spec = streams[0]().element_spec
  probe = probe or reverb_probe([side.client for side in shards])

  def make_feeds() -> shard_feeds.ShardFeeds:
    return shard_feeds.ShardFeeds(streams, where, probe=probe,
                                  check_s=check_s, timeout_s=timeout_s)

  def batches(feeds: shard_feeds.ShardFeeds):
    """Draws each batch's shards from the masses (one multinomial per
    batch: the same as one draw per element), takes that many samples of
    each, and refreshes the masses from what the samples carry."""
    masses, table_sizes = start.copy(), start.copy()
    rng = np.random.default_rng(seed)
    while True:
      up = feeds.wait_for_any()
      weights = np.where(up, masses, 0.0)
      share = weights / weights.sum()
      counts = rng.multinomial(batch_size, share)
      parts = []
      for k in np.flatnonzero(counts):
        taken = feeds.take(int(k), int(counts[k]))
        if taken is None:
          break  # Shard k went down: draw the batch again.
        parts += taken
      else:
        data, info, mask, source = tf.nest.map_structure(
            lambda *xs: np.concatenate(xs), *parts)
        _observe(info, source, masses, table_sizes, alpha)
        yield tf.nest.flatten(
            (data, info, mask, source,
             share[source] * info.probability.astype(np.float64),
             table_sizes.sum()))

  beta = shards[0].beta
  signature = (*chunk_spec, tf.TensorSpec([None], tf.float64),
               tf.TensorSpec([], tf.float64))

  def finish(*flat):
    data, info, mask, source, probability, total = tf.nest.pack_sequence_as(
        signature, flat)
    if beta is None:
      weight = tf.ones_like(info.probability, tf.float32)
    else:
      weight = dataset_lib.importance_weights(probability, total, beta())
    return dataset_lib.batch_output(data, info, mask, weight, source,
                                    decode=decode,
                                    as_train_kwargs=as_train_kwargs)

  pump = shard_feeds.BatchPump(
      make_feeds, batches, tf.nest.flatten(signature),
      closed_message=f'the sharded buffer over {where} was closed (its '
      'manager closed); make a new dataset from a new manager.')
  if on_start is not None:
    on_start(pump)  # May refuse (a closed manager): no thread started.
  return pump.start().dataset().map(finish).prefetch(prefetch)


def _size(client: reverb.Client, table: str, timeout_s: float) -> int:
  """The number of items in `table` on `client`'s server."""
  return int(client.server_info(timeout=max(1, int(timeout_s)))[
      table].current_size)


def _observe(info: Any, source: np.ndarray, masses: np.ndarray,
             table_sizes: np.ndarray, alpha: Optional[float]) -> None:
  """Refreshes each sampled shard's size and mass from what its samples
  carry (Reverb's SampleInfo); a shard absent from the batch keeps its
  values."""
  size = info.table_size.astype(np.float64)
  mass = size if alpha is None else (
      np.power(info.priority.astype(np.float64), alpha)
      / info.probability.astype(np.float64))
  for k in np.unique(source):
    mine = source == k
    table_sizes[k], masses[k] = size[mine].max(), mass[mine].max()


def reverb_probe(clients: Sequence[reverb.Client], *,
                 timeout_s: int = 1) -> shard_feeds.Probe:
  """A probe that asks each shard's Reverb server for its tables.

  Args:
    clients: one client per shard.
    timeout_s: how long a shard may take to answer.

  Returns:
    `probe(k)`: 'reverb' if shard k answered, else None (it cannot tell a
    restarted server from the same one; `instance_probe` can).
  """
  def probe(k: int) -> Optional[str]:
    try:
      clients[k].server_info(timeout=timeout_s)
    except Exception:  # pylint: disable=broad-except
      return None
    return 'reverb'
  return probe


def instance_probe(addresses: Sequence[str], *,
                   credentials: control_access.ClientCredentials,
                   timeout_s: float = 1.0) -> shard_feeds.Probe:
  """A probe that asks each shard's control service which instance serves.

  Args:
    addresses: each shard's Reverb address (its control service at the
      default control port).
    credentials: what the control services require of their callers.
    timeout_s: how long a shard may take to answer.

  Returns:
    `probe(k)`: the id of the server instance of shard k, or None if it did
    not answer (a new channel is made after a failure: gRPC would back off).
  """
  channels: Dict[int, control_lib.ControlClient] = {}

  def probe(k: int) -> Optional[str]:
    if k not in channels:
      channels[k] = control_lib.ControlClient(
          control_lib.control_address_for(addresses[k]),
          credentials=credentials)
    try:
      return channels[k].call('info', timeout_s=timeout_s)['instance']['id']
    except errors.SmartReplayError:
      failed = channels.pop(k, None)
      if failed is not None:
        failed.close()
      return None
  return probe


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
