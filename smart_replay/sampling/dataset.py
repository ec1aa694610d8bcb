"""The read path's one entry: a `tf.data` dataset of a buffer, from its sources.

`make_dataset` builds every dataset a manager hands out, whatever its
sources: the buffer's table on one server, a sharded buffer's shards, a
starter mixed in, or both (`sources.Source`, `batcher.Batcher`). It yields
what `tf_agents.train.Learner` expects from `ReverbReplayBuffer.as_dataset`:
`(trajectory, info)` with trajectory leaves `[batch, num_steps, ...]` and a
`ReplayInfo` broadcast to `[batch, num_steps]`, whose importance weights are
computed over each element's buffer.

Every wait is bounded: when no sample is allowed within the timeout, the
iterator raises a `tf.errors.OpError` whose message starts with
`WaitTimeoutError: Timed out after ...` and names the table, its server and
what holds sampling back, instead of waiting forever (Reverb's default); the
*same* iterator (the one a `Learner` holds) samples again on the next call.
"""

import dataclasses
from typing import Any, Callable, Optional, Sequence, Tuple

import tensorflow as tf

from smart_replay.sampling import batcher as batcher_lib
from smart_replay.sampling import replay_info as replay_info_lib
from smart_replay.sampling import sources as sources_lib
from smart_replay.sampling import windows as windows_lib


@dataclasses.dataclass(frozen=True)
class Output:
  """What each batch becomes for the Learner.

  Attributes:
    layout: the buffer's layout: `decode` turns stored steps into the data
      spec, once per batch.
    betas: per group (`ReplayInfo.source`), the importance exponent callable
      (`priorities.beta`), or None for weights of 1.
    as_train_kwargs: yield `(dict(experience=trajectory, weights=w), info)`
      for `Learner(use_kwargs_in_agent_train=True)`.
  """
  layout: Any
  betas: Sequence[Optional[Callable[[], Any]]]
  as_train_kwargs: bool = False


# Every function of the pipeline is traced as written: autograph converting
# them (and all they call) took about 2 s of the first dataset of a process,
# and they hold no Python control flow over tensors.
@tf.autograph.experimental.do_not_convert
def make_dataset(sources: Sequence[sources_lib.Source], *,
                 plan: batcher_lib.SamplingPlan, output: Output,
                 num_steps: Optional[int] = None,
                 shares: Optional[Callable[[], tf.Tensor]] = None,
                 closed_message: str = 'the buffer was closed'
                 ) -> Tuple[tf.data.Dataset, batcher_lib.Batcher]:
  """A dataset of batches drawn from `sources`.

  Args:
    sources: the tables to sample, each with its group (`ReplayInfo.source`)
      and shard; every group's tables must give windows of one form (same
      kind and item length, same stored step).
    plan: the batch size, timeout and prefetch.
    output: what each batch becomes (decode, weights, Learner kwargs).
    num_steps: steps per sample, a divisor of the item length (default the
      whole item; episode, packed and frame-stacked items: the whole item).
    shares: each group's share of a batch (`[G]` float64, read per batch);
      None for one group.
    closed_message: what the iterator raises after `Batcher.close()`.

  Returns:
    `(dataset, batcher)`: a dataset of `(trajectory, ReplayInfo)` batches
    (or `(dict(experience=..., weights=...), ReplayInfo)`), and its batcher,
    which takes the signals of watched sources and `close()`.

  Raises:
    ValueError: if `num_steps` does not fit a table (names it and its
      value).
  """
  windows = {}
  for source in sources:
    if source.group not in windows:
      windows[source.group] = windows_lib.Windows(source.table, output.layout,
                                                  num_steps)
  batcher = batcher_lib.Batcher(sources, windows, plan=plan, shares=shares,
                                closed_message=closed_message)
  dataset = batcher.dataset().map(
      lambda drawn: _finish(drawn, output),
      num_parallel_calls=2 if output.layout.rebuilds_on_read else None)
  return dataset.prefetch(plan.prefetch), batcher


def _finish(drawn: batcher_lib.Drawn, output: Output) -> Any:
  """A drawn batch as the Learner's `(trajectory, ReplayInfo)`."""
  window, info = drawn.window, drawn.window.info
  weight = replay_info_lib.importance_weights(
      drawn.probability, drawn.size, drawn.source, output.betas)
  steps = lambda t: tf.broadcast_to(t[:, None], tf.shape(window.mask))
  replay_info = replay_info_lib.ReplayInfo(
      key=steps(info.key), probability=steps(drawn.probability),
      table_size=steps(tf.cast(drawn.size, tf.int64)),
      priority=steps(info.priority), times_sampled=steps(info.times_sampled),
      weight=steps(weight), mask=window.mask, source=steps(drawn.source),
      shard=steps(drawn.shard))
  data = output.layout.decode(window.data)  # Once per batch.
  if output.as_train_kwargs:
    return dict(experience=data, weights=weight), replay_info
  return data, replay_info


def count_sources(dataset: tf.data.Dataset, counts: tf.Variable
                  ) -> tf.data.Dataset:
  """Counts the elements each group gave, as batches are made.

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
