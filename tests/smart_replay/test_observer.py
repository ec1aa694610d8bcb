"""Tests for smart_replay.observer, through a real Actor and a real server."""

import collections
import time

import numpy as np
import pytest
import tensorflow as tf
import tree
from tf_agents.trajectories import StepType

from smart_replay import errors
from smart_replay import tables
from tests import conftest


@pytest.mark.parametrize('sequence_length, stride_length', [(2, 1), (3, 1),
                                                            (3, 2)])
def test_items_are_the_windows_of_each_episode(make_manager, sequence_length,
                                               stride_length):
  manager = make_manager(sequence_length=sequence_length,
                         stride_length=stride_length)
  _, observer = manager.create_replay_buffer()
  record = conftest.run_actor(observer, 150)
  observer.flush()
  want = [conftest.item_fingerprint(i) for i in conftest.expected_items(
      record.steps, sequence_length, stride_length)]
  assert manager.num_frames() == len(want) > 0
  got = conftest.sample_all_items(manager)
  assert collections.Counter(got.values()) == collections.Counter(want)
  assert manager.stats()['env_steps'] == len(record.steps)


def test_items_never_straddle_episodes(make_manager):
  manager = make_manager(sequence_length=4)
  _, observer = manager.create_replay_buffer()
  conftest.run_actor(observer, 200)
  observer.flush()
  dataset = manager.get_dataset(batch_size=16)
  for trajectory, _ in dataset.take(20):
    step_type = trajectory.step_type.numpy()
    # A boundary (LAST) step may only close an item, and FIRST only open it.
    assert not (step_type[:, :-1] == StepType.LAST).any()
    assert not (step_type[:, 1:] == StepType.FIRST).any()


def test_a_new_actor_mid_episode_starts_a_new_episode(make_manager, env):
  # tf_agents.train.Actor resets its environment when built, so a second Actor
  # on the same observer starts with FIRST while an episode is still cached.
  manager = make_manager(sequence_length=3)
  _, observer = manager.create_replay_buffer()
  steps = []
  for seed in (0, 1, 2):
    steps += conftest.run_actor(observer, 7, seed=seed, env=env).steps
  observer.flush()
  assert sum(bool(s.is_first()) for s in steps) > sum(
      bool(s.is_boundary()) for s in steps)  # Some episodes were cut short.
  want = [conftest.item_fingerprint(i)
          for i in conftest.expected_items(steps, 3)]
  got = conftest.sample_all_items(manager)
  assert collections.Counter(got.values()) == collections.Counter(want)
  for trajectory, _ in manager.get_dataset(batch_size=8).take(10):
    assert not (trajectory.step_type.numpy()[:, 1:] == StepType.FIRST).any()


def test_observer_needs_a_trajectory_spec(make_manager):
  with pytest.raises(ValueError, match='must be a tf_agents Trajectory spec'):
    make_manager(data_spec={'x': tf.TensorSpec([1], tf.float32)})


def test_closed_observer_refuses_steps(make_manager, env):
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  observer.close()
  with pytest.raises(errors.ManagerStateError, match='observer is closed'):
    observer(_one_step(env, conftest.make_policy(env)))


def _one_step(env, policy):
  time_step = env.reset()
  step = policy.action(time_step)
  next_step = env.step(step.action)
  from tf_agents.trajectories import trajectory  # pylint: disable=g-import-not-at-top
  return trajectory.from_transition(time_step, step, next_step)


def test_bad_dtype_is_rejected_before_writing(make_manager, env):
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  record = conftest.run_actor(observer, 40)
  observer.flush()
  before = manager.num_frames()
  good = _one_step(env, conftest.make_policy(env))
  bad = good._replace(observation={
      **good.observation,
      'temperature': good.observation['temperature'].astype(np.float64)})
  with pytest.raises(errors.TrajectorySpecError) as raised:
    observer(bad)
  message = str(raised.value)
  assert "'observation/temperature'" in message
  assert 'expected dtype float32' in message and 'received dtype float64' in message
  observer.flush()
  assert manager.num_frames() == before
  assert manager.stats()['env_steps'] == len(record.steps)
  # The table is not poisoned: it still samples, and writing goes on.
  trajectory, _ = next(iter(manager.get_dataset(batch_size=4)))
  assert trajectory.observation['temperature'].dtype.name == 'float32'
  conftest.run_actor(observer, 20, seed=1)
  observer.flush()
  assert manager.num_frames() > before


def test_bad_shape_missing_field_and_batch_are_named(make_manager, env):
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  good = _one_step(env, conftest.make_policy(env))
  with pytest.raises(errors.TrajectorySpecError,
                     match=r"'action'.*shape \(1,\).*shape \(2,\)"):
    observer(good._replace(action=np.zeros([2], np.float32)))
  with pytest.raises(errors.TrajectorySpecError, match='missing fields'):
    observer(good._replace(policy_info={}))
  batched = tree.map_structure(lambda x: np.stack([x, x]), good)
  with pytest.raises(errors.TrajectorySpecError, match='looks batched'):
    observer(batched)
  assert manager.stats()['env_steps'] == 0


def test_flush_against_blocked_rate_limiter_times_out(make_manager):
  manager = make_manager(
      write_timeout_s=1.0,
      table_configs=[tables.TableConfig(samples_per_insert=1.0,
                                        error_buffer=2.0)])
  _, observer = manager.create_replay_buffer()
  start = time.monotonic()
  with pytest.raises(errors.WaitTimeoutError,
                     match='rate limiter.*experience|experience.*rate limiter'):
    conftest.run_actor(observer, 100)
    observer.flush()
  assert time.monotonic() - start < 10
  assert manager.num_frames() >= 1  # What was accepted is stored.
  # close() still stops the server, then reports the failed flush.
  with pytest.raises(errors.WaitTimeoutError, match='at flush'):
    manager.close()
  assert manager.server_address is None


def test_close_is_idempotent(make_manager):
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  conftest.run_actor(observer, 10)
  observer.close()
  observer.close()
  assert manager.num_frames() > 0
