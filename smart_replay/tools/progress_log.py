"""A periodic progress line for long tools: count, rate and ETA.

The imports and exports in `tools/` run unattended as often as in a
terminal, so they log (absl) rather than draw a bar: at most one line every
`every_s` seconds, e.g. `import: 12000/50000 items, 4100 items/s, ETA 9 s`.
"""

import time

from absl import logging


class ProgressLog:
  """Logs `label: done/total unit, rate, ETA` at most every `every_s` s.

  Args:
    label: what is progressing, e.g. 'import'.
    total: the count at the end.
    unit: what is counted, e.g. 'items'.
    every_s: seconds between lines.
  """

  def __init__(self, label: str, total: int, unit: str, *,
               every_s: float = 10.0):
    self._label, self._total, self._unit = label, total, unit
    self._every_s = every_s
    self._began = self._last = time.monotonic()

  def update(self, done: int) -> None:
    """Logs a line if `every_s` passed since the last one.

    Args:
      done: the count so far.
    """
    now = time.monotonic()
    if now - self._last < self._every_s or not done:
      return
    self._last = now
    rate = done / (now - self._began)
    logging.info('%s: %d/%d %s, %.0f %s/s, ETA %.0f s', self._label, done,
                 self._total, self._unit, rate, self._unit,
                 (self._total - done) / rate)
