"""A `tf.data` pipeline sampling a Reverb table, with a timeout that explains itself.

The dataset yields what `tf_agents.train.Learner` expects from
`ReverbReplayBuffer.as_dataset`: `(trajectory, info)` with trajectory leaves of
shape `[batch, num_steps, ...]` and an info broadcast to `[batch, num_steps]`.
The info is a `ReplayInfo`: Reverb's `SampleInfo` fields plus the
importance-sampling `weight` of prioritized replay and the padding `mask` of
episode items.

A Reverb sampler waits forever on an empty table by default. Here every wait
is bounded: when the rate limiter does not allow a sample within the timeout,
the iterator raises a `tf.errors.OpError` whose message starts with
`WaitTimeoutError: Timed out after ...` and names the table, its size and the
limiter, instead of the bare end-of-sequence Reverb gives. A timed-out Reverb
stream never recovers, so the dataset is an endless sequence of streams, each
ending in that error: the *same* iterator (the one a `Learner` holds) samples
again on the next call once there is data.
"""

from typing import Any, Callable, Optional, Tuple

import reverb
import tensorflow as tf

from smart_replay import errors
from smart_replay.sampling import items
from smart_replay.sampling.replay_info import importance_weights  # pylint: disable=unused-import
from smart_replay.sampling.replay_info import ONLINE, STARTER  # pylint: disable=unused-import
from smart_replay.sampling.replay_info import raw_importance_weights  # pylint: disable=unused-import
from smart_replay.sampling.replay_info import ReplayInfo
from smart_replay.server import local_server as server_lib
from smart_replay.utils import checks
from smart_replay.layouts import packed_items


def _timeout_message(client: reverb.Client, table: str, timeout_s: float
                     ) -> str:
  try:
    info = server_lib.server_info(client, 5.0)[table]
    limiter = info.rate_limiter_info
    state = (f'the table holds {info.current_size} items and sampling needs '
             f'at least min_size_to_sample={limiter.min_size_to_sample}')
    if limiter.max_diff < 1e300:  # A samples-per-insert limiter.
      state += (f'; its samples_per_insert={limiter.samples_per_insert:g} '
                f'limiter allows sampling within [{limiter.min_diff:g}, '
                f'{limiter.max_diff:g}] of the insert count')
  except errors.WaitTimeoutError as e:
    state = f'the server did not answer either ({e})'
  return (f'Timed out after {timeout_s:g} s waiting to sample from Reverb table '
          f'{table!r} at {client.server_address}: {state}. Write more data '
          'through the observer (and flush it), or raise sample_timeout_s. '
          'Iterate the dataset again (iter(dataset)) to resume sampling.')


def batch_output(data: Any, info: Any, mask: tf.Tensor, weight: tf.Tensor,
                 source: tf.Tensor, *, decode: Optional[Callable[[Any], Any]],
                 as_train_kwargs: bool):
  """What a dataset yields for one batch of sampled items.

  Args:
    data: the batch of stored steps, `[batch, num_steps, ...]`.
    info: Reverb's per-item sample info, each field `[batch]`.
    mask: bool `[batch, num_steps]`, False on episode padding.
    weight: float32 `[batch]` importance-sampling weights.
    source: int32 `[batch]` `ONLINE` or `STARTER`.
    decode: turns stored steps into the Learner's nest, or None.
    as_train_kwargs: yield `dict(experience=..., weights=weight)`.

  Returns:
    `(trajectory, ReplayInfo)` (or `(dict(experience, weights), ReplayInfo)`)
    with every per-item field broadcast over the steps.
  """
  steps = lambda t: tf.broadcast_to(t[:, None], tf.shape(mask))
  replay_info = ReplayInfo(
      key=steps(info.key), probability=steps(info.probability),
      table_size=steps(info.table_size), priority=steps(info.priority),
      times_sampled=steps(info.times_sampled), weight=steps(weight),
      mask=mask, source=steps(source))
  if decode is not None:  # Once per batch, after batching.
    data = decode(data)
  if as_train_kwargs:
    return dict(experience=data, weights=weight), replay_info
  return data, replay_info


def make_dataset(client: reverb.Client, *, table: str, data_spec: Any,
                 sequence_length: int, batch_size: int,
                 num_steps: Optional[int] = None,
                 variable_length: bool = False,
                 beta: Optional[Callable[[], Any]] = None,
                 as_train_kwargs: bool = False,
                 timeout_s: Optional[float] = 60.0,
                 max_in_flight_samples_per_worker: Optional[int] = None,
                 num_workers_per_iterator: int = 2,
                 drop_remainder: bool = True,
                 prefetch: int = 2,
                 decode: Optional[Callable[[Any], Any]] = None,
                 blocks: Optional[Tuple[int, int]] = None,
                 lookback: int = 0,
                 cut_block: Optional[Callable[..., Any]] = None
                 ) -> tf.data.Dataset:
  """Builds a batched, prefetched dataset sampling `table`.

  Args:
    client: a client of the server holding `table`.
    table: the table to sample.
    data_spec: the spec of one step as the table stores it (without the
      time dimension; a packed layout's `step_spec`).
    sequence_length: steps per stored item; for `variable_length` tables the
      longest item, to which shorter ones are padded (with `mask` False).
    batch_size: items per batch, >= 1.
    num_steps: steps per sample; must divide `sequence_length` (each item is
      then split into `sequence_length // num_steps` samples). None means
      `sequence_length`; variable-length items cannot be split.
    variable_length: items have up to `sequence_length` steps (episode
      tables); they are zero-padded at the end.
    beta: None for weights of 1, or a callable returning the importance
      exponent (a float or scalar tensor, evaluated per batch, so it can read
      a variable such as the train step).
    as_train_kwargs: yield `(dict(experience=trajectory, weights=w), info)`
      with per-sample weights `w = info.weight[:, 0]`, for
      `Learner(use_kwargs_in_agent_train=True)`, which then passes the
      weights to `agent.train`.
    timeout_s: seconds to wait for the rate limiter to allow a sample before
      raising; None waits forever (not recommended).
    max_in_flight_samples_per_worker: Reverb prefetch depth; default
      2 * batch_size.
    num_workers_per_iterator: Reverb sampler threads (-1: Reverb's automatic
      choice, which measured slower than 2 on 2 cores). Use 1 for FIFO and
      LIFO tables to keep their order.
    drop_remainder: drop the partial batch a timeout leaves (static batch
      shapes); pass False for tables that delete items when sampled, so none
      is lost.
    prefetch: batches to prefetch.
    decode: turns a batch of stored steps into the Learner's nest (a packed
      layout's `Layout.decode`); None keeps them as stored.
    blocks: `(block_length, windows_per_item)` of a table of packed items
      (see `blocks`): each sampled item is a block, from which that many
      windows of `sequence_length` steps are cut; None: items are windows.
    lookback: steps each item holds before its first (a frame-stacked
      layout's `lookback`; `decode` drops them).
    cut_block: a frame-stacked layout's `cut_block`, for its blocks.

  Returns:
    A `tf.data.Dataset` of `(trajectory, ReplayInfo)` batches (or
    `(dict(experience=..., weights=...), ReplayInfo)`).

  Raises:
    ValueError: if `batch_size`, `num_steps` or `timeout_s` is invalid; the
      message names the argument and its value.
  """
  checks.positive('batch_size', batch_size, integer=True)
  num_steps = sequence_length if num_steps is None else num_steps
  if (not isinstance(num_steps, int) or num_steps < 1 or
      sequence_length % num_steps):
    raise ValueError(
        f'num_steps={num_steps!r} must be a positive divisor of the table\'s '
        f'sequence_length={sequence_length} (items hold {sequence_length} '
        'steps; other lengths would silently drop steps).')
  if variable_length and num_steps != sequence_length:
    raise ValueError(
        f'num_steps={num_steps!r}: episode items are sampled whole '
        f'({sequence_length} steps with padding); pass num_steps=None.')
  if blocks is not None and num_steps != sequence_length:
    raise ValueError(
        f'num_steps={num_steps!r}: a table of packed items yields whole '
        f'windows of {sequence_length} steps; pass num_steps=None or '
        f'{sequence_length}.')
  if lookback and num_steps != sequence_length:
    raise ValueError(
        f'num_steps={num_steps!r}: items of a frame-stacked layout are '
        f'sampled whole ({sequence_length} steps); pass num_steps=None or '
        f'{sequence_length}.')
  if timeout_s is not None:
    checks.positive('timeout_s', timeout_s)
  dtypes, shapes = items.signature(data_spec, sequence_length,
                                   variable_length=variable_length,
                                   blocks=blocks, lookback=lookback)
  pieces = sequence_length // num_steps

  pad = lambda sample: items.pad(sample, sequence_length, lookback)
  split = lambda sample: items.split(sample, pieces, num_steps)

  def finish(*batch):
    """Adds the importance weights and broadcasts per-item info over steps."""
    if variable_length:
      data, info, mask = batch
    else:  # No mask to carry per item: every step is real.
      data, info = batch[0].data, batch[0].info
      mask = tf.ones([tf.shape(info.key)[0], num_steps], tf.bool)
    weight = (importance_weights(info.probability, info.table_size, beta())
              if beta is not None else tf.ones_like(info.probability,
                                                    tf.float32))
    return batch_output(data, info, mask, weight,
                        tf.fill(tf.shape(info.key), ONLINE), decode=decode,
                        as_train_kwargs=as_train_kwargs)

  def stream(_):
    """One Reverb sampling stream; it ends only when the timeout expires."""
    dataset = reverb.TrajectoryDataset(
        client.server_address, table, dtypes, shapes,
        max_in_flight_samples_per_worker=(max_in_flight_samples_per_worker or
                                          2 * batch_size),
        num_workers_per_iterator=num_workers_per_iterator,
        rate_limiter_timeout_ms=(-1 if timeout_s is None
                                 else int(timeout_s * 1000)))
    # Per-item work is what limits sampling speed, so fixed-length items go
    # straight into the batch; everything else happens once per batch.
    if blocks is not None and cut_block is not None:  # Blobs of frames.
      dataset = dataset.map(packed_items.cut_blob_windows(
          sequence_length, blocks[1], blocks[0], cut_block),
                            num_parallel_calls=2).unbatch()
      dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    elif blocks is not None:  # Enough blocks, then every window in one op.
      dataset = dataset.batch(-(-batch_size // blocks[1]),
                              drop_remainder=drop_remainder)
      dataset = dataset.map(packed_items.cut_windows(
          sequence_length, blocks[1], batch_size))
    elif variable_length:
      dataset = dataset.map(pad)
    elif pieces > 1:
      dataset = dataset.map(split).unbatch()
    if blocks is None:
      dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    dataset = dataset.map(finish, num_parallel_calls=2 if lookback else None)
    if timeout_s is not None:
      dataset = dataset.concatenate(timeout_tail(dataset.element_spec, client,
                                                  table, timeout_s))
    return dataset

  if timeout_s is None:
    return stream(None).prefetch(prefetch)
  # After a timeout error the next element starts a fresh stream.
  return tf.data.Dataset.range(2**62).flat_map(stream).prefetch(prefetch)


def table_dataset(client: reverb.Client, config: Any, *, data_spec: Any,
                  batch_size: int, num_steps: Optional[int] = None,
                  beta: Optional[Callable[[], Any]] = None,
                  as_train_kwargs: bool = False, timeout_s: float = 60.0,
                  prefetch: int = 2,
                  decode: Optional[Callable[[Any], Any]] = None,
                  lookback: int = 0,
                  cut_block: Optional[Callable[..., Any]] = None
                  ) -> tf.data.Dataset:
  """`make_dataset` with the settings a table's config calls for.

  FIFO and LIFO tables are sampled by one Reverb worker (to keep their
  order); tables that delete sampled items (`max_times_sampled`) prefetch one
  batch and keep the last, partial batch, so no sampled item is lost.

  Args:
    client: a client of the server.
    config: the table's resolved `TableConfig`.
    data_spec: the spec of one step as the table stores it.
    batch_size: items per batch.
    num_steps: steps per sample (see `make_dataset`).
    beta: the importance-sampling exponent (see `make_dataset`).
    as_train_kwargs: yield Learner keyword arguments (see `make_dataset`).
    timeout_s: seconds to wait for a sample before raising (> 0).
    prefetch: batches to prefetch.
    decode: turns a batch of stored steps into the Learner's nest (a packed
      layout's `Layout.decode`); None keeps them as stored.
    lookback: steps each item holds before its first (see `make_dataset`).
    cut_block: a frame-stacked layout's `cut_block` (see
      `make_dataset`).

  Returns:
    The dataset (see `make_dataset`).

  Raises:
    ValueError: if an argument is invalid; names it and its value.
  """
  ordered = config.sampler in ('fifo', 'lifo')
  consumed = config.max_times_sampled > 0  # Sampling deletes items.
  return make_dataset(
      client, table=config.name, data_spec=data_spec,
      sequence_length=config.item_length, batch_size=batch_size,
      blocks=(None if config.block_length is None else
              (config.block_length, config.windows_per_item)),
      num_steps=num_steps, variable_length=config.kind == 'episode',
      beta=beta, as_train_kwargs=as_train_kwargs, timeout_s=timeout_s,
      max_in_flight_samples_per_worker=batch_size if consumed else None,
      num_workers_per_iterator=1 if ordered or consumed else 2,
      drop_remainder=not consumed, prefetch=prefetch, decode=decode,
      lookback=lookback, cut_block=cut_block)


def timeout_tail(element_spec: Any, client: reverb.Client, table: str,
                 timeout_s: float) -> tf.data.Dataset:
  """One element that raises a descriptive error when it is produced.

  Reverb ends a sampling stream only when its rate-limiter timeout expires, so
  reaching this element means the dataset waited `timeout_s` for data.

  Args:
    element_spec: the spec of the stream's elements.
    client: a client of the server holding `table` (for the message).
    table: the sampled table.
    timeout_s: the timeout that expired.

  Returns:
    A one-element dataset whose element raises `WaitTimeoutError` (as a
    `tf.errors.OpError` naming the table and its state).
  """
  def fail():  # Never returns: producing this element is the timeout.
    raise errors.WaitTimeoutError(_timeout_message(client, table, timeout_s))

  def raise_instead(*element):
    trigger = tf.py_function(fail, [], tf.bool)
    with tf.control_dependencies([trigger]):
      return tf.nest.map_structure(tf.identity, element)

  zeros = tf.nest.map_structure(  # Never produced: only its shape matters.
      lambda s: tf.zeros([d or 0 for d in s.shape.as_list()], s.dtype),
      element_spec)
  return tf.data.Dataset.from_tensors(zeros).map(raise_instead)

