"""What `train_from_starter` writes to TensorBoard after each phase.

TF-Agents' collect metrics, the buffer's scalars (`smart_replay.telemetry`)
and, with a starter mixed in, its scheduled share of a batch and the share the
batches really had, all into the Learner's writer at one train step.
"""

from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from smart_replay.integrations import summaries
from smart_replay.sampling import fraction_schedule as schedule_lib


def write_summaries(writer: tf.summary.SummaryWriter,
                    collect_metrics: Sequence[Any], manager: Any, step: int,
                    share: Optional['StarterShare']) -> None:
  """Writes the phase's scalars into `writer` at `step`.

  Args:
    writer: the Learner's summary writer.
    collect_metrics: TF-Agents' collect metrics (named as
      `Actor.write_metric_summaries` names them: `Metrics/<name>`).
    manager: the started `ReplayBufferManager`.
    step: the train step.
    share: the starter's share ('mix'), or None.
  """
  with writer.as_default(), tf.summary.record_if(True):
    for metric in collect_metrics:
      tf.summary.scalar('Metrics/' + metric.name, metric.result(), step=step)
    summaries.write_buffer_summaries(manager, step)
    for tag, value in (share.scalars(step) if share else {}).items():
      tf.summary.scalar(tag, value, step=step)


class StarterShare:
  """The starter's scheduled share of a batch, and the share the batches
  made since the last call had ('mix').

  Args:
    schedule: the starter's `FractionSchedule`.
    sampled: the [2] int64 counts `sampling.mixing.count_sources` adds to.
  """

  def __init__(self, schedule: schedule_lib.FractionSchedule,
               sampled: tf.Variable):
    self._schedule, self._sampled = schedule, sampled
    self._last = np.asarray(sampled.numpy())

  def scalars(self, step: int) -> dict:
    """`{tag: value}`: 'buffer/starter/fraction' (scheduled at `step`) and
    'buffer/starter/sampled_fraction' (since the last call, if any batch)."""
    now = self._sampled.numpy()
    new, self._last = now - self._last, now
    scalars = {'buffer/starter/fraction': self._schedule.value(step)}
    if new.sum():
      scalars['buffer/starter/sampled_fraction'] = new[1] / new.sum()
    return scalars
