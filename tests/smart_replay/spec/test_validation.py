"""Tests for the values the observer checks, with a real Reverb server.

Step types and integer bounds are always errors; NaN/Inf follow `non_finite`
and floats outside their bounds `float_bounds`. A refused step writes
nothing, and the steps after it are stored as if it had never been sent.
"""

import collections
import logging

import numpy as np
import pytest
import reverb
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import StepType
from tf_agents.trajectories import trajectory as trajectory_lib

from smart_replay import errors
from smart_replay.config import options
from smart_replay.config import reverb_tables
from smart_replay.config import tables
from smart_replay.writing import observer as observer_lib

FIRST, MID, LAST = (int(StepType.FIRST), int(StepType.MID),
                    int(StepType.LAST))
# A tiny step: integer action in [0, 3], a bounded float observation.
SPEC = trajectory_lib.Trajectory(
    step_type=tf.TensorSpec([], tf.int32),
    observation={
        'position': tensor_spec.BoundedTensorSpec([2], tf.float32, -1., 1.),
        'speed': tf.TensorSpec([], tf.float32)},
    action=tensor_spec.BoundedTensorSpec([2], tf.int64, 0, 3),
    policy_info=(),
    next_step_type=tf.TensorSpec([], tf.int32),
    reward=tf.TensorSpec([], tf.float32),
    discount=tensor_spec.BoundedTensorSpec([], tf.float32, 0., 1.))
# Items of two consecutive steps, read back in insertion order.
PAIRS = tables.TableConfig(name='pairs', sampler='fifo',
                           max_times_sampled=1).resolve(
                               capacity=1000, sequence_length=2,
                               stride_length=1)


def _step(index, step_type=MID, next_step_type=MID, position=None,
          speed=None, action=None, reward=None, discount=None,
          num_envs=None):
  """A step whose values identify it (`index`).

  With `num_envs`, every environment gets the same values, except for a
  given `action`, which is then the whole batch.
  """
  def value(given, default, dtype, rank=0):
    array = np.asarray(default if given is None else given, dtype)
    if num_envs is not None and array.ndim == rank:
      array = np.stack([array] * num_envs)
    return array
  return trajectory_lib.Trajectory(
      step_type=value(None, step_type, np.int32),
      observation={
          'position': value(position, [index / 100, -index / 100],
                            np.float32, rank=1),
          'speed': value(speed, index, np.float32)},
      action=value(action, [index % 4, 3 - index % 4], np.int64, rank=1),
      policy_info=(),
      next_step_type=value(None, next_step_type, np.int32),
      reward=value(reward, index, np.float32),
      discount=value(discount, 1.0, np.float32))


def _episode(first_index, length):
  """`length` steps of one episode: FIRST, MID..., a boundary step."""
  steps = []
  for i in range(length):
    step_type = FIRST if i == 0 else MID
    next_step_type = LAST if i == length - 1 else MID
    steps.append(_step(first_index + i, step_type, next_step_type))
  steps.append(_step(first_index + length, LAST, FIRST))  # The boundary.
  return steps


class Buffer:
  """A real Reverb server with the `pairs` table, and observers on it."""

  def __init__(self):
    self.server = reverb.Server([reverb_tables.make_table(PAIRS, SPEC)])
    self.client = reverb.Client(f'localhost:{self.server.port}')
    self.observers = []

  def observer(self, **kwargs):
    writes = {k: kwargs.pop(k) for k in ('non_finite', 'float_bounds')
              if k in kwargs}
    observer = observer_lib.TrajectoryObserver(
        self.client, tables=[PAIRS], data_spec=SPEC,
        writes=options.WriteOptions(**writes), **kwargs)
    self.observers.append(observer)
    return observer

  def size(self):
    for observer in self.observers:
      observer.flush()
    return self.client.server_info(timeout=10)['pairs'].current_size

  def items(self):
    """Every stored item's flat fields, in insertion order (consumes them)."""
    size = self.size()
    if not size:
      return []
    return [tuple(np.asarray(leaf).tobytes() for leaf in sample.data)
            for sample in self.client.sample('pairs', num_samples=size,
                                             emit_timesteps=False)]


def _pairs(steps):
  """The items a correct observer makes of `steps` (windows in episodes)."""
  items, episode = [], []
  for step in steps:
    if int(step.step_type) == FIRST:
      episode = []
    episode.append(step)
    if len(episode) >= 2:
      fields = [np.stack(leaves) for leaves in zip(
          *(tf.nest.flatten(s) for s in episode[-2:]))]
      items.append(tuple(f.tobytes() for f in fields))
    if int(step.step_type) == LAST:
      episode = []
  return items


@pytest.fixture
def buffer():
  made = Buffer()
  yield made
  for observer in made.observers:
    observer.close()
  made.server.stop()


def _refused(observer, step, *patterns):
  """Calls `observer(step)`, which must raise naming every pattern."""
  with pytest.raises(errors.TrajectorySpecError) as raised:
    observer(step)
  message = str(raised.value)
  for pattern in patterns:
    assert pattern in message, (pattern, message)
  return message


# ------------------------------------------------------------------ step types

def test_step_type_7_is_refused(buffer):
  observer = buffer.observer()
  observer(_step(0, FIRST))
  _refused(observer, _step(1, step_type=7), "'step_type' holds 7",
           'FIRST=0, MID=1 or LAST=2', 'Nothing from this step was written')
  assert observer.num_steps == 1


def test_step_type_minus_1_is_refused(buffer):
  observer = buffer.observer()
  _refused(observer, _step(0, step_type=-1), "'step_type' holds -1",
           'FIRST=0, MID=1 or LAST=2')
  assert observer.num_steps == 0


def test_next_step_type_9_is_refused(buffer):
  observer = buffer.observer()
  observer(_step(0, FIRST))
  _refused(observer, _step(1, next_step_type=9), "'next_step_type' holds 9",
           'FIRST=0, MID=1 or LAST=2')
  assert observer.num_steps == 1


# ------------------------------------------------------------ integer bounds

def test_integer_action_out_of_bounds_is_refused(buffer):
  observer = buffer.observer()
  observer(_step(0, FIRST))
  _refused(observer, _step(1, action=[2, 4]),
           "'action' holds 4 at index [1]", 'int64[2] in [0, 3]',
           'Nothing from this step was written')
  _refused(observer, _step(1, action=[-1, 0]), "'action' holds -1 at index [0]")
  assert observer.num_steps == 1
  assert buffer.size() == 0


def test_batched_integer_action_out_of_bounds_refuses_the_whole_call(buffer):
  observer = buffer.observer(num_envs=3)
  steps = [_step(0, FIRST, num_envs=3)]
  observer(steps[0])
  bad = _step(1, action=[[0, 1], [2, 3], [1, 4]], num_envs=3)
  _refused(observer, bad, "'action' holds 4 at index [2, 1] (environment 2)",
           'int64[2] in [0, 3]',
           "No environment's step of this call was written")
  assert observer.num_steps == 3  # Only the first call's steps.
  assert buffer.size() == 0  # Environments 0 and 1 did not write theirs.
  steps += [_step(2, num_envs=3), _step(3, LAST, FIRST, num_envs=3)]
  for step in steps[1:]:
    observer(step)
  # Each environment's stream: the three valid steps, the bad one absent.
  per_env = [_pairs([tf.nest.map_structure(lambda a: a[k], s)  # pylint: disable=cell-var-from-loop
                     for s in steps]) for k in range(3)]
  assert collections.Counter(buffer.items()) == collections.Counter(
      sum(per_env, []))
  assert observer.num_steps == 9


# ------------------------------------------------------------------- NaN/Inf

def test_nan_reward_is_refused_by_default(buffer):
  observer = buffer.observer()
  observer(_step(0, FIRST))
  _refused(observer, _step(1, reward=np.nan), "'reward' holds nan",
           'expected finite values', "non_finite='error'")
  assert observer.num_steps == 1


def test_inf_observation_is_refused_by_default(buffer):
  observer = buffer.observer()
  observer(_step(0, FIRST))
  _refused(observer, _step(1, position=[0.5, np.inf]),
           "'observation/position' holds inf at index [1]",
           'expected finite values')
  _refused(observer, _step(1, speed=-np.inf), "'observation/speed' holds -inf")
  assert observer.num_steps == 1


def test_non_finite_warn_writes_and_logs_once_per_field(buffer, caplog):
  observer = buffer.observer(non_finite='warn')
  steps = [_step(0, FIRST), _step(1, reward=np.nan),
           _step(2, reward=np.inf, speed=np.nan), _step(3, LAST, FIRST)]
  with caplog.at_level(logging.WARNING):
    for step in steps:
      observer(step)
  warnings = [r.getMessage() for r in caplog.records
              if 'holds' in r.getMessage()]
  assert len(warnings) == 2, warnings  # reward once, speed once.
  assert "'reward' holds nan" in warnings[0]
  assert "non_finite='warn'" in warnings[0]
  assert "'observation/speed' holds nan" in warnings[1]
  assert observer.num_steps == 4
  assert buffer.items() == _pairs(steps)  # NaN/Inf stored as they are.


def test_non_finite_allow_writes_silently(buffer, caplog):
  observer = buffer.observer(non_finite='allow')
  steps = [_step(0, FIRST), _step(1, reward=np.nan, position=[np.inf, 0.]),
           _step(2, LAST, FIRST)]
  with caplog.at_level(logging.WARNING):
    for step in steps:
      observer(step)
  assert not [r for r in caplog.records if 'holds' in r.getMessage()]
  assert buffer.items() == _pairs(steps)


# ------------------------------------------------------------- float bounds

@pytest.mark.parametrize('policy', [None, 'error', 'warn', 'allow'])
def test_float_out_of_bounds_follows_float_bounds(buffer, caplog, policy):
  kwargs = {} if policy is None else {'float_bounds': policy}
  observer = buffer.observer(**kwargs)
  steps = [_step(0, FIRST), _step(1, position=[0.5, 1.5]),
           _step(2, position=[-2., 0.], discount=0.5),
           _step(3, LAST, FIRST)]
  with caplog.at_level(logging.WARNING):
    observer(steps[0])
    if policy == 'error':
      _refused(observer, steps[1],
               "'observation/position' holds 1.5 at index [1]",
               'float32[2] in [-1.0, 1.0]', "float_bounds='error'")
      steps = [steps[0], steps[3]]
      observer(steps[1])
    else:  # 'warn' is the default.
      for step in steps[1:]:
        observer(step)
  warnings = [r.getMessage() for r in caplog.records
              if 'holds' in r.getMessage()]
  if policy in (None, 'warn'):
    assert len(warnings) == 1, warnings  # Once for the field.
    assert "'observation/position' holds 1.5 at index [1]" in warnings[0]
    assert "float_bounds='warn'" in warnings[0]
  else:
    assert not warnings
  assert buffer.items() == _pairs(steps)


def test_value_policies_are_checked(buffer):
  with pytest.raises(ValueError, match=r"non_finite must be one of \('error', "
                     r"'warn', 'allow'\), got 'ignore'"):
    buffer.observer(non_finite='ignore')
  with pytest.raises(ValueError, match='float_bounds must be one of .*got None'):
    buffer.observer(float_bounds=None)


# ---------------------------------------------------------------- structure

def test_a_dict_instead_of_a_trajectory_is_named(buffer):
  observer = buffer.observer()
  message = _refused(observer, _step(0, FIRST)._asdict(),
                     'trajectory is a dict with keys',
                     "'discount', 'next_step_type', 'observation'",
                     'expected a tf_agents Trajectory', 'Trajectory(**step)',
                     'the field paths are the same')
  assert 'missing fields [], unexpected fields []' not in message
  # Deeper down: a namedtuple where the spec has a dict, same field paths.
  speed_first = collections.namedtuple('Observation', ['speed', 'position'])
  step = _step(0, FIRST)
  _refused(observer, step._replace(observation=speed_first(
      **step.observation)), 'at observation the data spec has dict with keys '
           "['position', 'speed'], the trajectory Observation (namedtuple)",
           'the field paths are the same')
  assert observer.num_steps == 0


def test_a_python_list_where_the_spec_has_an_array_is_named(buffer):
  observer = buffer.observer()
  step = _step(0, FIRST)
  message = _refused(observer, step._replace(action=[1, 2]),
                     "field 'action' is a Python list of 2 values",
                     'one int64 array of shape (2,)',
                     'np.asarray(value, dtype=np.int64)')
  assert 'unexpected fields' not in message
  assert observer.num_steps == 0


def test_a_dict_with_another_key_is_refused(buffer):
  """Tree's structure check compares positions only: 'velocity' would be
  stored as 'speed' (both sort after 'position')."""
  observer = buffer.observer()
  step = _step(0, FIRST)
  renamed = {'position': step.observation['position'],
             'velocity': step.observation['speed']}
  _refused(observer, step._replace(observation=renamed),
           "missing fields ['observation/speed'], unexpected fields "
           "['observation/velocity']", 'Nothing from this step was written')
  # A namedtuple with the fields in another order is refused too: tree would
  # take it, storing its discount as the reward and its reward as discount.
  fields = list(trajectory_lib.Trajectory._fields)
  fields[-2:] = ['discount', 'reward']
  reordered = collections.namedtuple('Reordered', fields)
  _refused(observer, reordered(**step._asdict()),
           'at <root> the data spec has Trajectory (namedtuple), the '
           'trajectory Reordered (namedtuple)')
  assert observer.num_steps == 0
  # Look-alikes that flatten in the spec's order are still taken.
  look_alike = collections.namedtuple('Trajectory',
                                      trajectory_lib.Trajectory._fields)
  observer(look_alike(*step))
  observer(tuple(_step(1)))
  assert observer.num_steps == 2


# -------------------------------------------------- a refused step is absent

def test_after_a_refused_step_the_stream_goes_on_as_if_it_never_came(buffer):
  observer = buffer.observer()
  steps = _episode(0, 4) + _episode(10, 3)
  bad_ones = [_step(50, step_type=7), _step(51, next_step_type=9),
              _step(52, action=[0, 9]), _step(53, reward=np.nan),
              _step(54, FIRST, position=[np.inf, 0.])]
  sizes = []
  for index, step in enumerate(steps):
    observer(step)
    if index < len(bad_ones):
      before = buffer.size()
      with pytest.raises(errors.TrajectorySpecError):
        observer(bad_ones[index])
      sizes.append((before, buffer.size()))
  assert all(before == after for before, after in sizes), sizes
  assert observer.num_steps == len(steps)
  assert observer.num_episodes == 2
  assert buffer.items() == _pairs(steps)


# ------------------------------------------------------ Reverb's int32 limit

def test_capacity_above_reverbs_limit_is_refused(make_manager):
  with pytest.raises(ValueError, match=r'capacity is 2147483648, the max_size '
                     r"of table 'experience' .*at most 2147483647 \(2\*\*31 - "
                     r'1\)'):
    make_manager(capacity=2**31)
  with pytest.raises(ValueError, match=r'capacity is 2147483648'):
    tables.TableConfig().resolve(capacity=2**31, sequence_length=2,
                                 stride_length=1)
  # The limit itself is what Reverb takes.
  config = tables.TableConfig().resolve(capacity=2**31 - 1, sequence_length=2,
                                        stride_length=1)
  assert reverb_tables.make_table(config, SPEC).info.max_size == 2**31 - 1


@pytest.mark.parametrize('field, kwargs', [
    ('max_size', {}),
    ('max_times_sampled', {}),
    ('min_size_to_sample', {}),
    ('sequence_length', {}),
    ('episode_length', {'kind': 'episode'}),
])
def test_table_config_counts_above_reverbs_limit_are_refused(field, kwargs):
  with pytest.raises(ValueError, match=rf"TableConfig\('experience'\)\.{field} "
                     r'is 2147483648; expected at most 2147483647'):
    tables.TableConfig(**{field: 2**31}, **kwargs)
