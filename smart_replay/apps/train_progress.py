"""Progress of a training run: a bar on a terminal, log lines otherwise.

`TrainProgress` shows train steps against the target with rate and ETA, and
beside them the environment steps (and their rate), finished episodes, the
recent collect return and the buffer's size. It also writes the two rates as
TensorBoard scalars, `train_steps_per_sec` (as TF-Agents'
`StepPerSecondLogTrigger` names it) and `Metrics/EnvironmentStepsPerSecond`.
"""

import sys
import time
from typing import Optional

from absl import logging
import tensorflow as tf
import tqdm


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
