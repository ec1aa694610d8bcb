"""Progress of a long tool: a bar on a terminal, a log line otherwise.

The imports and exports in `tools/` run in a terminal as often as unattended
(a log file, CI). `ProgressLog` draws a tqdm bar (count, rate, ETA) when
stderr is a terminal and absl logs at INFO (not `--quiet`), and otherwise logs
at most one line every `every_s` seconds, e.g.
`import: 12000/50000 items, 4100 items/s, ETA 9 s`.
"""

import sys
import time
from typing import Optional

from absl import logging
import tqdm


class ProgressLog:
  """Shows `label: done/total unit, rate, ETA`; a context manager.

  Args:
    label: what is progressing, e.g. 'import'.
    total: the count at the end.
    unit: what is counted, e.g. 'items'.
    every_s: seconds between log lines (without a bar).
    bar: draw a tqdm bar; None: when stderr is a terminal and absl logs
      INFO lines.
  """

  def __init__(self, label: str, total: int, unit: str, *,
               every_s: float = 5.0, bar: Optional[bool] = None):
    self._label, self._total, self._unit = label, total, unit
    self._every_s = every_s
    self._began = self._last = time.monotonic()
    if bar is None:
      bar = sys.stderr.isatty() and logging.level_info()
    self._bar = tqdm.tqdm(total=total, desc=label, unit=unit.rstrip('s'),
                          dynamic_ncols=True, file=sys.stderr) if bar else None

  def update(self, done: int) -> None:
    """Moves the bar, or logs a line if `every_s` passed since the last one.

    Args:
      done: the count so far.
    """
    if self._bar is not None:
      self._bar.update(done - self._bar.n)
      return
    now = time.monotonic()
    if now - self._last < self._every_s or not done:
      return
    self._last = now
    rate = done / (now - self._began)
    logging.info('%s: %d/%d %s, %.0f %s/s, ETA %.0f s', self._label, done,
                 self._total, self._unit, rate, self._unit,
                 (self._total - done) / rate)

  def close(self) -> None:
    """Closes the bar (safe to call twice)."""
    if self._bar is not None:
      self._bar.close()

  def __enter__(self) -> 'ProgressLog':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
