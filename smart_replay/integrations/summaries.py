"""The buffer's statistics as TensorBoard scalars.

`buffer_scalars(manager)` turns `manager.stats()` into flat scalars named
`buffer/<name>` (the first table, and buffer-wide counts) and
`buffer/<table>/<name>` (every table, when there are several):

- `items`, `inserts`, `samples`: what the table holds, and the rate
  limiter's completed inserts and samples (Reverb counts samples a dataset
  prefetched);
- `sample_to_insert_ratio`: samples / inserts so far (0 before any insert);
- `insert_blocked_s`, `sample_blocked_s`: how long inserting / sampling has
  been blocked by the rate limiter right now, and `insert_wait_total_s`,
  `sample_wait_total_s`: Reverb's total time callers waited;
- `max_priority` (prioritized tables): the largest priority given so far,
  which new items get. The minimum and mean of the stored items' priorities
  are not summarized: Reverb 0.14 reads them only by sampling (which changes
  the counts and the rate limiter) or from a snapshot of the tables (the
  cost of a checkpoint), and `manager.stats()` does not report them;
- `env_steps`, `episodes`: steps and finished episodes written through the
  buffer's observers;
- `shard<k>/items`, `shard<k>/inserts`, `shard<k>/samples`: each shard of a
  sharded buffer (client mode over several servers; the first table), beside
  the sums above (of the shards up); `shard<k>/up`: 1, or 0 while the shard
  does not answer.
- `starter/items`: the items of a manager's read-only starter table (see
  `smart_replay.sampling.fraction_schedule`), when it has one.
"""

from typing import Any, Dict, Optional

import tensorflow as tf
from tf_agents.train import interval_trigger

_TABLE_FIELDS = ('items', 'inserts', 'samples')
_LIMITER_FIELDS = (('insert_blocked_s', 'insert_blocked_for_s'),
                   ('sample_blocked_s', 'sample_blocked_for_s'),
                   ('insert_wait_total_s', 'insert_wait_total_s'),
                   ('sample_wait_total_s', 'sample_wait_total_s'))


def buffer_scalars(manager: Any) -> Dict[str, float]:
  """The buffer's scalars, by TensorBoard tag.

  Args:
    manager: a started `ReplayBufferManager` (local or client mode).

  Returns:
    `{tag: value}`; see the module docstring for the tags.
  """
  stats = manager.stats()
  tables = stats['tables']
  scalars = {'buffer/env_steps': float(stats['env_steps']),
             'buffer/episodes': float(stats['episodes'])}
  for index, (name, table) in enumerate(tables.items()):
    values = {field: float(table[field]) for field in _TABLE_FIELDS}
    values['sample_to_insert_ratio'] = (
        table['samples'] / table['inserts'] if table['inserts'] else 0.0)
    limiter = table.get('rate_limiter', {})
    for tag, key in _LIMITER_FIELDS:
      if limiter.get(key) is not None:
        values[tag] = float(limiter[key])
    if table.get('max_priority') is not None:
      values['max_priority'] = float(table['max_priority'])
    prefixes = (['buffer'] if index == 0 else []) + (
        [f'buffer/{name}'] if len(tables) > 1 else [])
    for prefix in prefixes:
      scalars.update({f'{prefix}/{k}': v for k, v in values.items()})
  first = next(iter(tables))
  for index, shard in enumerate(stats.get('shards', ())):
    scalars[f'buffer/shard{index}/up'] = float(shard.get('up', True))
    for field in ('items', 'inserts', 'samples'):
      if first in shard['tables']:  # A shard down has none.
        scalars[f'buffer/shard{index}/{field}'] = float(
            shard['tables'][first][field])
  starter = getattr(manager, 'starter', None)
  if starter is not None:  # A read-only starter table mixed into batches.
    scalars['buffer/starter/items'] = float(starter.items)
  return scalars


def write_buffer_summaries(manager: Any, step: Any) -> Dict[str, float]:
  """Writes the buffer's scalars into the default summary writer.

  Like any `tf.summary` call it writes nothing without a default writer and
  follows the current `tf.summary.record_if`::

      with writer.as_default():
        telemetry.write_buffer_summaries(manager, step=train_step)

  Args:
    manager: a started `ReplayBufferManager`.
    step: the step to write them at (an int or a `tf.Variable`).

  Returns:
    The scalars written, by tag.
  """
  scalars = buffer_scalars(manager)
  for tag, value in scalars.items():
    tf.summary.scalar(tag, value, step=step)
  return scalars


class BufferSummaries:
  """A TF-Agents Learner trigger that writes the buffer's scalars.

  One line in a Learner::

      learner.Learner(..., triggers=[telemetry.BufferSummaries(manager)])

  The Learner calls its triggers as `trigger(train_step)` after every
  `run()`, inside its own train summary writer: with `summary_dir=None`
  (the default) the scalars go into that writer, so `<root_dir>/train`
  keeps one event file (TensorBoard, without `--reload_multifile`, polls
  only the newest event file of a directory). It writes at its first call,
  then once `interval` train steps have passed since the last write, or
  when forced (`force_trigger=True`), whatever the Learner's
  `summary_interval`.

  Args:
    manager: a started `ReplayBufferManager`.
    summary_dir: a directory for an event file of its own; None (default)
      writes into the default summary writer current at each call (the
      Learner's, for a trigger; nothing is written when there is none).
    interval: train steps between writes.

  Raises:
    ValueError: if `interval` is not a positive integer.
  """

  def __init__(self, manager: Any, *, summary_dir: Optional[str] = None,
               interval: int = 1000):
    if isinstance(interval, bool) or not isinstance(interval, int) or (
        interval < 1):
      raise ValueError(f'interval must be a positive integer, got '
                       f'{interval!r}.')
    self._manager = manager
    self._writer = (tf.summary.create_file_writer(summary_dir)
                    if summary_dir is not None else None)
    self._step = 0
    # Started an interval before step 0, so that the first call writes.
    self._trigger = interval_trigger.IntervalTrigger(
        interval, self._write, start=-interval)

  def __call__(self, train_step: Any, force_trigger: bool = False) -> None:
    """Writes the scalars if the interval passed (or if forced).

    Args:
      train_step: the current train step (an int, a numpy or a tensor
        scalar, or a `tf.Variable`).
      force_trigger: write regardless of the interval.
    """
    self._step = int(train_step)
    if force_trigger:
      self._trigger.set_start(self._step)
      self._write()
    else:
      self._trigger(self._step)

  def _write(self) -> None:
    # The Learner runs its triggers under `record_if(step %
    # summary_interval == 0)`; this trigger has its own interval.
    with tf.summary.record_if(True):
      if self._writer is None:
        write_buffer_summaries(self._manager, self._step)
        return
      with self._writer.as_default():
        write_buffer_summaries(self._manager, self._step)
      self._writer.flush()
