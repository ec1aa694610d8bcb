"""A warning about a flood of events, at most one line per interval.

`ThrottledWarning` counts events (refused calls, malformed requests,
refused connections) and logs one warning line for the first, then at most
one per `every_s` with the count since the last line, so a flood costs a
few log lines, not one per event. `flush()` logs a count not logged yet
once the interval has passed (for a caller with a periodic hook).
"""

import math
import threading
import time

from absl import logging


class ThrottledWarning:
  """Counts events and logs at most one warning line per `every_s`.

  Args:
    template: the line, a `str.format` template with the fields `count`
      (events since the last line), `total` (since the start), `latest`
      (the last event's detail, as given) and `every_s`.
    every_s: the least time between two lines, in seconds.

  Raises:
    ValueError: if `every_s` is not a positive number.
  """

  def __init__(self, template: str, *, every_s: float = 10.0):
    if isinstance(every_s, bool) or not isinstance(
        every_s, (int, float)) or not every_s > 0:
      raise ValueError(f'every_s must be a positive number, got {every_s!r}.')
    self._template, self._every_s = template, float(every_s)
    self._lock = threading.Lock()
    self.total = 0
    self._pending = 0
    self._latest = ''
    self._last = -math.inf

  def __call__(self, detail: str) -> None:
    """Counts one event; logs unless a line was logged lately.

    Args:
      detail: what happened, for the line's `latest` field.
    """
    with self._lock:
      self.total += 1
      self._pending += 1
      self._latest = detail
    self.flush()

  def flush(self) -> None:
    """Logs the events not logged yet, unless a line was logged lately."""
    with self._lock:
      now = time.monotonic()
      if not self._pending or now - self._last < self._every_s:
        return
      count, self._pending, self._last = self._pending, 0, now
      line = self._template.format(count=count, total=self.total,
                                   latest=self._latest,
                                   every_s=self._every_s)
    logging.warning('%s', line)
