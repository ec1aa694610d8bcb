"""What a training run reports after each collect + train phase.

`TrainReport` does it all at one train step, after each phase and once more
at a last step off the phase grid:

- into the Learner's train/ writer (`write_summaries`): TF-Agents' collect
  metrics (`Metrics/<name>`), the buffer's scalars
  (`smart_replay.integrations.summaries`) and, with a starter mixed in
  (`StarterShare`), its scheduled share of a batch and the share the batches
  really had;
- `TrainProgress`: train steps against the target with rate and ETA, the
  environment steps (and their rate), finished episodes, the recent collect
  return and the buffer's size, as a bar on a terminal or a log line at an
  interval otherwise. It also writes the two rates as TensorBoard scalars,
  `train_steps_per_sec` (as TF-Agents' `StepPerSecondLogTrigger` names it)
  and `Metrics/EnvironmentStepsPerSecond`.
"""

import sys
import time
from typing import Any, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf
import tqdm

from smart_replay.integrations import summaries
from smart_replay.sampling import fraction_schedule as schedule_lib


class StarterShare:
  """The starter's scheduled share of a batch, and the share the batches
  made since the last call had ('mix').

  Args:
    schedule: the starter's `FractionSchedule`.
    sampled: the [2] int64 counts `sampling.dataset.count_sources` adds to.
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


def write_summaries(writer: tf.summary.SummaryWriter,
                    collect_metrics: Sequence[Any], manager: Any, step: int,
                    share: Optional[StarterShare]) -> None:
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


class TrainProgress:
  """Counts train and environment steps; draws or logs them.

  Args:
    total: the train step to reach.
    start: the train step the run starts at (a resumed run's).
    env_steps: environment steps taken before (a resumed run's).
    show_progress: draw a tqdm bar; otherwise log a line every
      `log_every_s` seconds.
    log_every_s: seconds between log lines without a bar.
    summary_writer: where the rates go, or None.
  """

  def __init__(self, *, total: int, start: int, env_steps: int,
               show_progress: bool, log_every_s: float,
               summary_writer: Optional[tf.summary.SummaryWriter]):
    self._total = total
    self._start_step, self._start_env = start, env_steps
    self._began = self._last_log = self._last_rate = time.monotonic()
    self._last_step, self._last_env = start, env_steps
    self._log_every_s = log_every_s
    self._writer = summary_writer
    self._bar = tqdm.tqdm(total=total, initial=start, desc='train',
                          unit='step', dynamic_ncols=True, file=sys.stderr
                          ) if show_progress else None

  def update(self, *, step: int, env_steps: int, episodes: int,
             recent_return: float, items: int, loss: float) -> None:
    """Shows the state after a collect + train iteration.

    Args:
      step: the train step reached.
      env_steps: environment steps taken in all.
      episodes: episodes finished in all.
      recent_return: the collect policy's average return (recent episodes).
      items: the buffer's items.
      loss: the last training loss.
    """
    now = time.monotonic()
    if self._writer is not None and now > self._last_rate:
      elapsed = now - self._last_rate
      with self._writer.as_default(), tf.summary.record_if(True):
        tf.summary.scalar('train_steps_per_sec',
                          (step - self._last_step) / elapsed, step=step)
        tf.summary.scalar('Metrics/EnvironmentStepsPerSecond',
                          (env_steps - self._last_env) / elapsed, step=step)
    self._last_rate, self._last_step, self._last_env = now, step, env_steps
    if self._bar is not None:
      # The postfix first: update() redraws.
      self._bar.set_postfix({'env_steps': env_steps, 'episodes': episodes,
                             'return': f'{recent_return:.2f}',
                             'items': items}, refresh=False)
      self._bar.update(step - self._bar.n)
      return
    if now - self._last_log < self._log_every_s and step < self._total:
      return
    self._last_log = now
    elapsed = max(now - self._began, 1e-9)
    rate = (step - self._start_step) / elapsed
    eta = (self._total - step) / rate if rate else float('inf')
    logging.info(
        'train step %d/%d (%.0f%%), %.1f train steps/s, ETA %.0f s; %d env '
        'steps (%.0f/s), %d episodes, recent return %.2f; buffer %d items; '
        'loss %.4f', step, self._total, 100.0 * step / self._total, rate, eta,
        env_steps, (env_steps - self._start_env) / elapsed, episodes,
        recent_return, items, loss)

  def close(self) -> None:
    """Closes the bar (safe to call twice)."""
    if self._bar is not None:
      self._bar.close()


class TrainReport:
  """Writes a phase's scalars and shows the progress, at one train step.

  Args:
    writer: the Learner's train summary writer.
    collect_metrics: TF-Agents' collect metrics, in the order
      `actor.collect_metrics` makes them (episodes, environment steps,
      average return, average episode length).
    manager: the started `ReplayBufferManager`.
    share: the starter's share ('mix'), or None.
    progress: the run's `TrainProgress` (its rates go to `writer` too).
  """

  def __init__(self, *, writer: tf.summary.SummaryWriter,
               collect_metrics: Sequence[Any], manager: Any,
               share: Optional[StarterShare], progress: TrainProgress):
    self._writer, self._metrics = writer, collect_metrics
    self._manager, self._share, self._progress = manager, share, progress
    self._written = None  # The train step of the last summaries.

  def phase(self, step: int, loss: float) -> None:
    """Reports the collect + train phase that reached `step`.

    Args:
      step: the train step reached.
      loss: the phase's last training loss.
    """
    self._written = step
    write_summaries(self._writer, self._metrics, self._manager, step,
                    self._share)
    episodes, env_steps, average_return, _ = self._metrics
    self._progress.update(step=step, env_steps=int(env_steps.result()),
                          episodes=int(episodes.result()),
                          recent_return=float(average_return.result()),
                          items=self._manager.num_frames(), loss=loss)

  def close(self) -> None:
    """Closes the progress bar (safe to call twice)."""
    self._progress.close()

  def finish(self, step: int) -> None:
    """Writes the scalars at the run's last step unless a phase did.

    Args:
      step: the train step the run ends at (a stop before any training
        phase, or a resumed run with nothing left to train, ends off the
        phase grid).
    """
    if self._written != step:
      write_summaries(self._writer, self._metrics, self._manager, step,
                      self._share)
