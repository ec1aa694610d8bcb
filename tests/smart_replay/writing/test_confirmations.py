"""Tests for smart_replay.writing.confirmations."""

import time

import pytest

from smart_replay.writing import confirmations

pytestmark = pytest.mark.unit


def test_counts_items_confirmed_after_a_time():
  log = confirmations.ConfirmationLog()
  log.add(5, now=100.2)
  log.add(3, now=100.9)
  log.add(0, now=101.0)  # Nothing.
  log.add(4, now=102.5)
  log.add(1, now=110.0)
  assert log.total == 13
  assert log.confirmed_after(99.0) == 13
  assert log.confirmed_after(100.5) == 8
  assert log.confirmed_after(101.0) == 5
  assert log.confirmed_after(105.0) == 1
  assert log.confirmed_after(200.0) == 0


def test_items_sent_after_the_restart_are_not_lost():
  log = confirmations.ConfirmationLog()
  log.add(5, now=100.0)  # In the checkpoint whose save began at 100.5.
  log.add(3, now=101.0)  # Sent after the save began: lost with the server.
  log.add(4, now=103.0)  # Sent to the new server, started at 102.0.
  assert log.lost_at_restart(100.5, restarted=102.0) == 3
  assert log.lost_at_restart(100.5, restarted=102.0) == 0  # Counted once.


def test_memory_is_bounded_and_thinned_entries_count_as_late():
  log = confirmations.ConfirmationLog(max_entries=8)
  for second in range(100):
    log.add(2, now=float(second))
  assert len(log._entries) <= 8  # pylint: disable=protected-access
  assert log.confirmed_after(99.5) == 0
  assert log.confirmed_after(99.0) == 2  # Recent times stay exact.
  # Old times are coarser: never fewer than the exact count (200 - 2 * t).
  for when in (0.0, 10.0, 50.0, 90.0):
    assert 200 - 2 * when <= log.confirmed_after(when) <= 200


@pytest.mark.parametrize('bad', [3, 0, 2.5, True])
def test_bad_max_entries(bad):
  with pytest.raises(ValueError, match='max_entries'):
    confirmations.ConfirmationLog(max_entries=bad)


def test_lost_at_restart_counts_each_item_once():
  log = confirmations.ConfirmationLog()
  now = time.time()
  log.add(5, now=now - 10)
  log.add(3, now=now - 5)
  assert log.lost_at_restart(now - 7) == 3
  assert log.lost_at_restart(None) == 0  # Counted already.
  log.add(2)
  assert log.lost_at_restart(None) == 2
