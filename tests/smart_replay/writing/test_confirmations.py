"""Tests for smart_replay.writing.confirmations."""

import time

import pytest

from smart_replay.writing import confirmations

pytestmark = pytest.mark.unit


def test_counts_items_sent_after_a_time():
  log = confirmations.ConfirmationLog()
  log.add(5, sent=100.2, seen=100.3)
  log.add(3, sent=100.9, seen=101.0)
  log.add(0, sent=101.0)  # Nothing.
  log.add(4, sent=102.5, seen=103.0)
  log.add(1, seen=110.0)  # Sent when seen.
  assert log.total == 13
  assert log.confirmed_after(99.0) == 13
  assert log.confirmed_after(100.5) == 8
  assert log.confirmed_after(101.0) == 5
  assert log.confirmed_after(105.0) == 1
  assert log.confirmed_after(200.0) == 0


def test_items_sent_after_the_restart_are_not_lost():
  log = confirmations.ConfirmationLog()
  log.add(5, sent=100.0, seen=100.1)  # In the checkpoint (save at 100.5).
  log.add(3, sent=101.0, seen=101.1)  # Sent after: lost with the server.
  log.add(4, sent=103.0, seen=103.1)  # Sent to the new one, started at 102.
  assert log.lost_at_restart(100.5, restarted=102.0) == 3
  assert log.lost_at_restart(100.5, restarted=102.0) == 0  # Counted once.


def test_items_seen_confirmed_after_the_restart_are_not_lost():
  # Sent while the old server ran (after the save began), but confirmed by
  # the new one (Reverb's writer sent them again): it holds them. However
  # late the restart is noticed.
  log = confirmations.ConfirmationLog()
  log.add(5, sent=100.0, seen=100.1)  # In the checkpoint (save at 100.5).
  log.add(3, sent=101.0, seen=101.1)  # Confirmed by the server that died.
  log.add(20, sent=101.5, seen=102.4)  # Re-sent to the one started at 102.
  log.add(2, sent=102.6, seen=102.7)
  assert log.seen_before(102.0) == 8
  assert log.lost_at_restart(100.5, restarted=102.0) == 3


def test_no_restart_time_counts_every_item_sent_after_the_save():
  log = confirmations.ConfirmationLog()
  log.add(5, sent=100.0, seen=100.1)
  log.add(3, sent=101.0, seen=103.0)
  assert log.lost_at_restart(100.5) == 3


def test_memory_is_bounded_and_thinned_entries_count_as_late():
  log = confirmations.ConfirmationLog(max_entries=8)
  for second in range(100):
    log.add(2, sent=float(second), seen=second + 0.5)
  assert len(log._entries) <= 8  # pylint: disable=protected-access
  assert log.confirmed_after(99.5) == 0
  assert log.confirmed_after(99.0) == 2  # Recent times stay exact.
  # Old times are coarser, and count as late: never fewer items sent after
  # a time than the exact count (200 - 2 * t), never more seen before it.
  for when in (0.0, 10.0, 50.0, 90.0):
    assert 200 - 2 * when <= log.confirmed_after(when) <= 200
    assert 0 <= log.seen_before(when + 0.6) <= 2 * (when + 1)


@pytest.mark.parametrize('bad', [3, 0, 2.5, True])
def test_bad_max_entries(bad):
  with pytest.raises(ValueError, match='max_entries'):
    confirmations.ConfirmationLog(max_entries=bad)


def test_lost_at_restart_counts_each_item_once():
  log = confirmations.ConfirmationLog()
  now = time.time()
  log.add(5, sent=now - 10)
  log.add(3, sent=now - 5)
  assert log.lost_at_restart(now - 7) == 3
  assert log.lost_at_restart(None) == 0  # Counted already.
  log.add(2)
  assert log.lost_at_restart(None) == 2
