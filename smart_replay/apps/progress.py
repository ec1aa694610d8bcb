"""Progress of collecting a starter buffer: count, show, stop.

`Progress` is the observer `populate_starter_buffer` gives the
`tf_agents.train.Actor`: it writes each step through the buffer's observer,
counts steps and episodes, draws a tqdm bar (or logs a line at an interval),
warns once when the buffer is full, and ends the Actor's run at the requested
total or when a stop is requested.
"""

import time
from typing import Any, Callable, Optional

from absl import logging
import numpy as np
import tqdm

from smart_replay.manager import facade as manager_lib


class StopCollection(Exception):
  """Raised inside the Actor's loop to end collection early."""


class TotalReached(Exception):
  """Raised inside the Actor's loop when the requested total is reached."""


class Progress:
  """The Actor's observer: writes the step, counts it, shows progress, stops.

  It calls the manager's observer itself, first: `tf_agents.train.Actor`
  de-duplicates its observers through a set, so their order is arbitrary, and
  a step counted (or a stop raised) before it is written would be lost.

  Args:
    observer: the manager's observer; gets every step first.
    total: env steps to collect in all (boundary steps not counted; the
      counts are defined in `smart_replay.writing.counters`).
    done: env steps collected before (a resumed buffer).
    episodes: episodes finished before.
    label: the progress bar's and log lines' label.
    manager: the started manager (its size is shown).
    capacity: the buffer's capacity (a warning once it is full).
    show_progress: draw a tqdm bar; otherwise log a line every
      `log_every_s` seconds.
    log_every_s: seconds between log lines without a bar.
    stop_requested: polled after every step, or None.

  Attributes:
    steps: steps collected so far, including `done`.
    episodes: episodes finished so far.
  """

  def __init__(self, observer: Callable[[Any], None], *, total: int,
               done: int, episodes: int, label: str,
               manager: manager_lib.ReplayBufferManager, capacity: int,
               show_progress: bool, log_every_s: float,
               stop_requested: Optional[Callable[[], bool]]):
    self._observer = observer
    self.steps = done
    self.episodes = episodes
    self._total = total
    self._start_steps, self._start_time = done, time.monotonic()
    self._label = label
    self._manager = manager
    self._capacity = capacity
    self._stop_requested = stop_requested
    self._log_every_s = log_every_s
    self._last_check = self._last_log = self._start_time
    self._warned_full = False
    self._items = 0
    self._bar = tqdm.tqdm(total=total, initial=done, unit='step', desc=label,
                          dynamic_ncols=True) if show_progress else None

  def __call__(self, trajectory) -> None:
    """Writes one step, counts it, and ends the run at the total or a stop.

    Args:
      trajectory: the step from the Actor.

    Raises:
      TotalReached: once `total` steps are collected.
      StopCollection: once `stop_requested()` is true.
    """
    self._observer(trajectory)
    if bool(np.asarray(trajectory.is_boundary())):
      self.episodes += 1
    else:
      self.steps += 1
      if self._bar is not None:
        self._bar.update(1)
      if self.steps >= self._total:
        raise TotalReached()
    now = time.monotonic()
    if now - self._last_check >= 1.0:
      self._last_check = now
      self.refresh(now)
    if self._stop_requested is not None and self._stop_requested():
      raise StopCollection()

  def refresh(self, now: Optional[float] = None) -> None:
    """Reads the buffer size, warns once when full, updates the display.

    Args:
      now: `time.monotonic()`; read if None.
    """
    now = time.monotonic() if now is None else now
    self._items = self._manager.num_frames()
    if self._items >= self._capacity and not self._warned_full:
      self._warned_full = True
      logging.warning(
          'The buffer is full (%d items = capacity): from now on each new item '
          'evicts the oldest one. Raise capacity to keep everything.',
          self._capacity)
    if self._bar is not None:
      self._bar.set_postfix(finished_episodes=self.episodes,
                            items=self._items)
    elif now - self._last_log >= self._log_every_s:
      self._last_log = now
      rate = (self.steps - self._start_steps) / max(now - self._start_time,
                                                    1e-9)
      eta = (self._total - self.steps) / rate if rate else float('inf')
      logging.info('%s: %d/%d env steps (%.0f%%), %.0f env steps/s, %d '
                   'finished episodes, %d items, ETA %.0f s', self._label,
                   self.steps, self._total,
                   100.0 * self.steps / self._total, rate, self.episodes,
                   self._items, eta)

  def close(self) -> None:
    """Closes the progress bar."""
    if self._bar is not None:
      self._bar.close()
