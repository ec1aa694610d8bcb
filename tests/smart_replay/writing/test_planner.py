"""Tests for smart_replay.writing.planner: which items each step completes.

No Reverb server: a stream's plan is driven the way the observer drives it,
and each emitted item is recorded as the indices of the steps it holds.
"""

import pytest
from tf_agents.trajectories import StepType

from smart_replay.config import tables
from smart_replay.writing import counters as counters_lib
from smart_replay.writing import planner as planner_lib

FIRST, MID, LAST = int(StepType.FIRST), int(StepType.MID), int(StepType.LAST)

pytestmark = pytest.mark.unit


def _sequence(name='seq', sequence_length=3, stride_length=1, **kwargs):
  return tables.TableConfig(name=name, **kwargs).resolve(
      capacity=100, sequence_length=sequence_length,
      stride_length=stride_length)


def _episodes(name='ep', episode_length=4, long_episodes='split', **kwargs):
  return tables.TableConfig(
      name=name, kind='episode', episode_length=episode_length,
      long_episodes=long_episodes, **kwargs).resolve(
          capacity=100, sequence_length=2, stride_length=1)


def _episode(length):
  """Step types of one episode of `length` steps (FIRST, MID..., LAST)."""
  return [FIRST] + [MID] * (length - 2) + [LAST]


class _Stream:
  """Drives one `StreamPlan` like the observer; records its items."""

  def __init__(self, planner, offset=0):
    self.steps = []  # Indices of the steps written, in order.
    self.items = []  # (table, priority, step indices).
    self.offset = offset
    self.plan = planner.stream(self._emit)

  def _emit(self, table, priority, length):
    self.items.append((table, priority, tuple(self.steps[-length:])))

  def write(self, step_type):
    if self.plan.starts_episode(step_type):
      self.plan.end_episode()
    self.steps.append(self.offset + len(self.steps))
    if self.plan.add(step_type):
      self.plan.end_episode()

  def write_all(self, step_types):
    for step_type in step_types:
      self.write(step_type)
    return self

  def windows(self, table=None):
    return [steps for name, _, steps in self.items
            if table is None or name == table]


def _plan(configs, **kwargs):
  counters = counters_lib.Counters.for_tables(
      [c.name for c in configs],
      [c.name for c in configs if c.kind == 'episode'])
  planner = planner_lib.ItemPlanner(configs, counters=counters, **kwargs)
  return planner, counters


@pytest.mark.parametrize('stride_length, starts', [(1, [0, 1, 2, 3]),
                                                   (2, [0, 2]),
                                                   (3, [0, 3])])
def test_sequence_items_are_windows_every_stride(stride_length, starts):
  planner, counters = _plan([_sequence(sequence_length=3,
                                       stride_length=stride_length)])
  stream = _Stream(planner).write_all(_episode(6))
  assert stream.windows() == [tuple(range(s, s + 3)) for s in starts]
  assert counters.items == {'seq': len(starts)}
  assert counters.steps == 6 and counters.episodes == 1


def test_items_never_straddle_a_last_step():
  planner, counters = _plan([_sequence(sequence_length=3)])
  stream = _Stream(planner).write_all(_episode(6) + _episode(6))
  assert stream.windows() == [(0, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 5),
                              (6, 7, 8), (7, 8, 9), (8, 9, 10), (9, 10, 11)]
  assert counters.episodes == 2


def test_a_first_step_mid_episode_starts_a_new_episode():
  planner, counters = _plan([_sequence(sequence_length=3)])
  stream = _Stream(planner).write_all([FIRST, MID, MID, FIRST, MID, MID, MID,
                                       LAST])
  assert stream.windows() == [(0, 1, 2), (3, 4, 5), (4, 5, 6), (5, 6, 7)]
  assert counters.episodes == 1  # Only a LAST step ends one.


def test_a_gap_starts_a_new_episode_and_restart_forgets_the_episode():
  planner, _ = _plan([_sequence(sequence_length=2)])
  stream = _Stream(planner).write_all([FIRST, MID])
  stream.plan.gap = True
  stream.write_all([MID, MID])
  assert stream.windows() == [(0, 1), (2, 3)]
  stream.plan.restart()
  stream.write_all([MID, MID, LAST])
  assert stream.windows()[2:] == [(4, 5), (5, 6)]


def test_cross_episode_items_span_boundaries_until_a_restart():
  planner, _ = _plan([_sequence(sequence_length=3, cross_episodes=True)])
  assert not planner.clear_at_episode_end
  stream = _Stream(planner).write_all(_episode(6) + _episode(6))
  assert stream.windows() == [tuple(range(s, s + 3)) for s in range(10)]
  stream.plan.restart()
  stream.write_all(_episode(3))
  assert stream.windows()[10:] == [(12, 13, 14)]


def test_short_episodes_give_no_item_and_are_counted():
  planner, counters = _plan([_sequence(sequence_length=4),
                             _sequence('long', sequence_length=6)])
  stream = _Stream(planner).write_all(_episode(2) + _episode(3) +
                                      _episode(5))
  assert stream.windows() == [(5, 6, 7, 8), (6, 7, 8, 9)]
  # Short for the shortest table only: the 5-step episode is not.
  assert counters.short_episodes == 2
  assert counters.short_episode_steps == 5


@pytest.mark.parametrize('long_episodes, windows, dropped', [
    ('split', [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)], 0),
    ('truncate', [(0, 1, 2, 3)], 0),
    ('drop', [], 1)])
def test_long_episodes(long_episodes, windows, dropped):
  planner, counters = _plan([_episodes(episode_length=4,
                                       long_episodes=long_episodes)])
  stream = _Stream(planner).write_all(_episode(10))
  assert stream.windows() == windows
  assert counters.long_episodes == {'ep': 1}
  assert counters.dropped_episodes == {'ep': dropped}
  # Episodes of at most episode_length steps are whole items in every mode.
  stream.write_all(_episode(4) + _episode(2))
  assert stream.windows()[len(windows):] == [(10, 11, 12, 13), (14, 15)]
  assert counters.long_episodes == {'ep': 1}


def test_an_episode_cut_by_a_first_step_is_an_episode_item():
  planner, _ = _plan([_episodes(episode_length=4)])
  stream = _Stream(planner).write_all([FIRST, MID, MID, FIRST, LAST])
  assert stream.windows() == [(0, 1, 2), (3, 4)]


def test_sequence_and_episode_tables_share_the_steps():
  planner, counters = _plan([_sequence(sequence_length=2), _episodes()])
  stream = _Stream(planner).write_all(_episode(3))
  assert stream.items == [('seq', 1.0, (0, 1)), ('seq', 1.0, (1, 2)),
                          ('ep', 1.0, (0, 1, 2))]
  assert counters.items == {'seq': 2, 'ep': 1}


def test_priorities():
  configs = [_sequence('plain', sequence_length=1),
             _sequence('fixed', sequence_length=1, initial_priority=3.0),
             _sequence('asks', sequence_length=1, sampler='prioritized')]
  asked = []

  def priority_fn(table):
    asked.append(table)
    return 7

  def priorities(**kwargs):
    planner, _ = _plan(configs, **kwargs)
    stream = _Stream(planner).write_all([FIRST])
    return {table: priority for table, priority, _ in stream.items}

  assert priorities(priority_fn=priority_fn) == {'plain': 1.0, 'fixed': 3.0,
                                                 'asks': 7.0}
  assert asked == ['asks']
  assert priorities() == {'plain': 1.0, 'fixed': 3.0, 'asks': 1.0}
  assert priorities(priority=2, priority_fn=priority_fn) == {
      'plain': 2.0, 'fixed': 2.0, 'asks': 2.0}
  assert asked == ['asks']


def test_streams_of_batched_environments_are_independent():
  planner, counters = _plan([_sequence(sequence_length=3), _episodes()])
  streams = [_Stream(planner, offset=100 * i) for i in range(2)]
  episodes = [_episode(3) + _episode(5), [MID, MID] + _episode(6)]
  for step_types in zip(*episodes):  # One batched call per step.
    for stream, step_type in zip(streams, step_types):
      stream.write(step_type)
  assert streams[0].windows('seq') == [(0, 1, 2), (3, 4, 5), (4, 5, 6),
                                       (5, 6, 7)]
  assert streams[0].windows('ep') == [(0, 1, 2), (3, 4, 5, 6), (7,)]
  # The second stream starts mid-episode: its first two steps are an episode
  # fragment, ended by the FIRST step.
  assert streams[1].windows('seq') == [(102, 103, 104), (103, 104, 105),
                                       (104, 105, 106), (105, 106, 107)]
  assert streams[1].windows('ep') == [(100, 101), (102, 103, 104, 105),
                                      (106, 107)]
  assert counters.steps == 16
  assert counters.episodes == 3
  assert counters.short_episodes == 1 and counters.short_episode_steps == 2
  assert counters.long_episodes == {'ep': 2}
