"""Batches mixing a read-only starter table into a buffer's own (online) table.

Each element of a batch comes from the starter with probability `fraction`
(read from a `FractionSchedule` each time an element is drawn, so it follows
the train step), else from the online table: `tf.data`'s
`sample_from_datasets` over two endless per-item Reverb streams, then one
batch. The number of starter elements in a batch of B is therefore
Binomial(B, fraction), and nothing is sampled that is not used (the online
table's sample counters and rate limiter see only the samples it served).

Importance-sampling weights are computed per source: an element's weight
corrects only for how its own table sampled it, `(N * P(i)) ** -beta` with
that table's size N, probability P(i) and beta (1 for a uniform table), and
is normalized by the largest weight of the same source in the batch. The
mixing fraction itself is a deliberate choice of the data distribution and is
not corrected for. `ReplayInfo.source` says where each element came from
(`ONLINE` 0 or `STARTER` 1); priority updates apply to online elements only
(the starter is read-only).
"""

from typing import Any, Callable, NamedTuple, Optional

import reverb
import tensorflow as tf

from smart_replay.config import mixable
from smart_replay.sampling import dataset as dataset_lib
from smart_replay.sampling import items as items_lib
from smart_replay.sampling import fraction_schedule as schedule_lib
from smart_replay.spec import specs
from smart_replay.utils import checks


class Source(NamedTuple):
  """One side of a mix: a table on a server, and how its weights are made.

  Attributes:
    client: a client of the server holding the table.
    config: the table's resolved `TableConfig`.
    beta: the importance exponent callable (see `priorities.beta`), or None
      for weights of 1.
  """
  client: reverb.Client
  config: Any
  beta: Optional[Callable[[], Any]]


def check_mixable(online: Any, starter: Any, online_spec: Any,
                  starter_spec: Any) -> None:
  """Raises ValueError if the two tables cannot share a batch.

  Args:
    online: the online table's `TableConfig`.
    starter: the starter table's `TableConfig`.
    online_spec: the online table's stored step spec.
    starter_spec: the starter's stored step spec.

  Raises:
    ValueError: naming the table, the field and both values.
  """
  for side, config in (('online', online), ('starter', starter)):
    mixable.check_drawable(config, f'the {side} table')
  for field in ('kind', 'item_length'):
    if getattr(online, field) != getattr(starter, field):
      raise ValueError(
          f'the starter table {starter.name!r} has {field}='
          f'{getattr(starter, field)!r} but the online table {online.name!r} '
          f'has {getattr(online, field)!r}; mixed batches need items of one '
          'shape.')
  diffs = specs.diff_specs(starter_spec, online_spec)
  if diffs:
    raise ValueError(
        'the starter and the online table store different steps: '
        + '; '.join(f'{f}: starter {a}, online {b}' for f, a, b in diffs))


def check_num_steps(num_steps: Optional[int], length: int,
                    variable: bool) -> int:
  """`num_steps`, or the item length when None; checked.

  Args:
    num_steps: steps per sample, or None for the whole item.
    length: the table's item length.
    variable: whether items are episodes (sampled whole).

  Returns:
    The steps per sample.

  Raises:
    ValueError: unless a positive divisor of `length` (for episodes: it).
  """
  num_steps = length if num_steps is None else num_steps
  if (isinstance(num_steps, bool) or not isinstance(num_steps, int) or
      num_steps < 1 or length % num_steps or
      (variable and num_steps != length)):
    raise ValueError(
        f'num_steps={num_steps!r} must be a positive divisor of the tables\' '
        f'item length {length} (episode items: the whole item).')
  return num_steps


def mixed_dataset(online: Source, starter: Source, *, data_spec: Any,
                  schedule: schedule_lib.FractionSchedule,
                  train_step: Optional[tf.Variable], batch_size: int,
                  num_steps: Optional[int] = None,
                  decode: Optional[Callable[[Any], Any]] = None,
                  as_train_kwargs: bool = False, timeout_s: float = 60.0,
                  prefetch: int = 2) -> tf.data.Dataset:
  """A dataset of batches mixing `starter` into `online` (module docstring).

  Args:
    online: the buffer's own table.
    starter: the read-only starter table (same item shape and step spec;
      see `check_mixable`).
    data_spec: the spec of one stored step.
    schedule: the starter's share of each batch.
    train_step: the train-step variable (needed if `schedule` or a beta is
      annealed).
    batch_size: elements per batch.
    num_steps: steps per sample; a divisor of the item length (default the
      whole item; episode items are sampled whole).
    decode: turns a batch of stored steps into the Learner's nest.
    as_train_kwargs: yield `(dict(experience=..., weights=w), info)`.
    timeout_s: how long either stream may wait for a sample before the
      iterator raises (naming that table); the same iterator samples again
      on the next call.
    prefetch: batches to prefetch.

  Returns:
    A dataset of `(trajectory, ReplayInfo)` batches, as `make_dataset`, with
    `ReplayInfo.source` set per element.

  Raises:
    ValueError: if an argument is invalid (names it and its value).
  """
  checks.positive('batch_size', batch_size, integer=True)
  checks.positive('timeout_s', timeout_s)
  length = online.config.item_length
  variable = online.config.kind == 'episode'
  num_steps = check_num_steps(num_steps, length, variable)
  schedule.tensor(train_step)  # Raises now if it needs the step.
  streams = [item_stream(side, data_spec, length, num_steps, variable,
                         batch_size, timeout_s, source)
             for source, side in ((dataset_lib.ONLINE, online),
                                  (dataset_lib.STARTER, starter))]

  def weights(_):
    share = tf.cast(schedule.tensor(train_step), tf.float32)
    return tf.stack([1.0 - share, share])  # Indexed by ReplayInfo.source.

  # The weights are made once per batch (the schedule moves with the train
  # step, once per batch), not once per element.
  choices = tf.data.Dataset.from_tensors(0).repeat().map(
      lambda _: tf.repeat(weights(_)[None], batch_size, 0)).unbatch()
  mixed = tf.data.Dataset.sample_from_datasets(streams, weights=choices,
                                               stop_on_empty_dataset=True)
  betas = (online.beta, starter.beta)

  def finish(data, info, mask, source):
    raw = [_raw_weights(info, beta) for beta in betas]
    raw = tf.where(source == dataset_lib.STARTER, raw[1], raw[0])
    largest = tf.math.unsorted_segment_max(raw, source, 2)
    weight = tf.cast(raw / tf.gather(largest, source), tf.float32)
    return dataset_lib.batch_output(data, info, mask, weight, source,
                                    decode=decode,
                                    as_train_kwargs=as_train_kwargs)

  return mixed.batch(batch_size, drop_remainder=True).map(finish).prefetch(
      prefetch)


def _raw_weights(info: Any, beta: Optional[Callable[[], Any]]) -> tf.Tensor:
  """`(N * P(i)) ** -beta` per element (float64); 1 without a beta."""
  if beta is None:
    return tf.ones_like(info.probability, tf.float64)
  return dataset_lib.raw_importance_weights(info.probability, info.table_size,
                                            beta())


def item_stream(side: Source, data_spec: Any, length: int, num_steps: int,
                variable: bool, batch_size: int, timeout_s: float,
                source: int) -> tf.data.Dataset:
  """An endless stream of `(data, info, mask, source)` items of one table.

  Args:
    side: the table and its server.
    data_spec: the spec of one stored step.
    length: the table's item length.
    num_steps: steps per element (a divisor of `length`).
    variable: whether items are episodes (padded to `length`).
    batch_size: the batch size (sets how many samples are in flight).
    timeout_s: how long a sample may wait before the stream raises.
    source: the value of `ReplayInfo.source` for its elements.

  Returns:
    The stream; after a timeout its next element starts a fresh one.
  """
  dtypes, shapes = items_lib.signature(data_spec, length,
                                       variable_length=variable)
  pieces = length // num_steps
  tag = tf.constant(source, tf.int32)

  def item(sample):
    """`(data, info, mask, source)` of one sampled item."""
    if variable:
      return (*items_lib.pad(sample, length), tag)
    return sample.data, sample.info, tf.ones([num_steps], tf.bool), tag

  def stream(_):
    sampled = reverb.TrajectoryDataset(
        side.client.server_address, side.config.name, dtypes, shapes,
        max_in_flight_samples_per_worker=2 * batch_size,
        num_workers_per_iterator=2,
        rate_limiter_timeout_ms=int(timeout_s * 1000))
    if pieces > 1:
      sampled = sampled.map(
          lambda s: items_lib.split(s, pieces, num_steps)).unbatch()
    sampled = sampled.map(item)  # One map per item: this is the hot path.
    return sampled.concatenate(dataset_lib.timeout_tail(
        sampled.element_spec, side.client, side.config.name, timeout_s))

  # After a timeout error the next element starts a fresh stream.
  return tf.data.Dataset.range(2**62).flat_map(stream)


def count_sources(dataset: tf.data.Dataset, counts: tf.Variable
                  ) -> tf.data.Dataset:
  """Counts the elements each source gave, as batches are made.

  Args:
    dataset: a dataset of `(experience, ReplayInfo)` batches.
    counts: an int64 variable of shape [2], indexed by `ReplayInfo.source`
      (`ONLINE`, `STARTER`); each batch adds its elements per source.

  Returns:
    The same batches (counted when produced, so prefetched batches count
    before they are used).
  """
  def count(experience, info):
    counts.assign_add(tf.math.bincount(info.source[:, 0], minlength=2,
                                       maxlength=2, dtype=tf.int64))
    return experience, info
  return dataset.map(count)
