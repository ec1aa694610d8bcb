"""A flood of events costs one warning line per interval."""

import time

import pytest

from smart_replay.utils import throttled_log


@pytest.mark.unit
def test_one_line_per_interval_with_the_count_since_the_last(caplog):
  caplog.set_level('WARNING')
  warn = throttled_log.ThrottledWarning(
      '{count} of {total} in {every_s:g} s, latest {latest!r}', every_s=0.2)
  for k in range(5):
    warn(f'event\n{k}')
  assert [r.getMessage() for r in caplog.records] == [
      "1 of 1 in 0.2 s, latest 'event\\n0'"]
  warn.flush()  # Too soon: nothing.
  assert len(caplog.records) == 1
  time.sleep(0.25)
  warn.flush()
  assert caplog.records[-1].getMessage() == (
      "4 of 5 in 0.2 s, latest 'event\\n4'")
  warn.flush()  # Nothing pending.
  assert len(caplog.records) == 2 and warn.total == 5
  with pytest.raises(ValueError, match='every_s must be a positive number, '
                     'got 0'):
    throttled_log.ThrottledWarning('x', every_s=0)
