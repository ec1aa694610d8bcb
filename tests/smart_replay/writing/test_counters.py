"""Tests for smart_replay.writing.counters."""

import pytest

from smart_replay.writing import counters as counters_lib

pytestmark = pytest.mark.unit

_KEYS = ['steps', 'env_steps', 'episodes', 'items', 'short_episodes',
         'short_episode_steps', 'long_episodes', 'dropped_episodes', 'lost_steps', 'lost_items',
         'lost_at_restart', 'reconnects', 'resent_items']


def _counted():
  counters = counters_lib.Counters.for_tables(['seq', 'ep'], ['ep'])
  counters.steps, counters.episodes, counters.reconnects = 10, 2, 1
  counters.items['seq'] += 9
  counters.items['ep'] += 2
  counters.long_episodes['ep'] += 1
  counters.lost_items = counters.lost_at_restart = 3
  return counters


def test_for_tables_starts_at_zero_with_every_table():
  counters = counters_lib.Counters.for_tables(['seq', 'ep'], ['ep'])
  assert counters.as_dict() == dict(
      dict.fromkeys(_KEYS, 0), items={'seq': 0, 'ep': 0},
      long_episodes={'ep': 0}, dropped_episodes={'ep': 0})
  assert counters.num_items == 0


def test_as_dict_is_a_copy_in_field_order():
  counters = _counted()
  counts = counters.as_dict()
  assert list(counts) == _KEYS
  assert counts['items'] == {'seq': 9, 'ep': 2} and counters.num_items == 11
  counters.items['seq'] += 1
  assert counts['items'] == {'seq': 9, 'ep': 2}


def test_reset_zeroes_every_count_and_keeps_the_tables():
  counters = _counted()
  items = counters.items
  counters.reset()
  assert counters.as_dict() == counters_lib.Counters.for_tables(
      ['seq', 'ep'], ['ep']).as_dict()
  assert counters.items is items  # Holders of the dict see the reset.


def test_total_sums_counts_and_tables():
  other = counters_lib.Counters.for_tables(['seq', 'more'], [])
  other.steps = 5
  other.items['more'] = 4
  total = counters_lib.Counters.total([_counted(), other, _counted()])
  assert total.steps == 25 and total.episodes == 4 and total.reconnects == 2
  assert total.items == {'seq': 18, 'ep': 4, 'more': 4}
  assert total.long_episodes == {'ep': 2}
  assert total.lost_items == total.lost_at_restart == 6
  assert counters_lib.Counters.total([]).as_dict() == dict(
      dict.fromkeys(_KEYS, 0), items={}, long_episodes={},
      dropped_episodes={})
