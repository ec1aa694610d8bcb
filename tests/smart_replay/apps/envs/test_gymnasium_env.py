"""The Gymnasium adapter: specs, seeding, terminated vs truncated, the buffer."""

import numpy as np
import pytest
from tf_agents.environments import utils as env_utils
from tf_agents.policies import random_py_policy
from tf_agents.trajectories import time_step as ts

import smart_replay
from smart_replay.apps.envs import factory
from smart_replay.apps.envs import gymnasium_env
from tests import testing


def _episode_ends(env, policy, steps):
  """(step_type, discount) of every LAST step in `steps` env steps."""
  ends, time_step = [], env.reset()
  for _ in range(steps):
    time_step = env.step(policy.action(time_step).action)
    if time_step.is_last():
      ends.append(float(time_step.discount))
  return ends


def test_cartpole_validates_and_is_reproducible():
  env = factory.make_environment('gymnasium:CartPole-v1', seed=7)
  assert env.action_spec().dtype == np.int64
  assert (env.action_spec().minimum, env.action_spec().maximum) == (0, 1)
  assert env.observation_spec().shape == (4,)
  env_utils.validate_py_environment(env, episodes=3)
  first = factory.make_environment('gymnasium:CartPole-v1', seed=7).reset()
  again = factory.make_environment('gymnasium:CartPole-v1', seed=7).reset()
  np.testing.assert_array_equal(first.observation, again.observation)


def test_terminated_gets_discount_0_and_truncated_discount_1():
  # Pendulum never terminates: every episode ends by its 200-step limit.
  env = gymnasium_env.GymnasiumEnv('Pendulum-v1', seed=0)
  assert env.action_spec().shape == (1,) and env.action_spec().dtype == (
      np.float32)
  policy = random_py_policy.RandomPyPolicy(env.time_step_spec(),
                                           env.action_spec(), seed=0)
  assert _episode_ends(env, policy, 401) == [1.0, 1.0]
  # CartPole under a random policy falls over: terminated, discount 0.
  cartpole = gymnasium_env.GymnasiumEnv('CartPole-v1', seed=0)
  policy = random_py_policy.RandomPyPolicy(cartpole.time_step_spec(),
                                           cartpole.action_spec(), seed=0)
  ends = _episode_ends(cartpole, policy, 200)
  assert ends and set(ends) == {0.0}
  truncated = gymnasium_env.GymnasiumEnv('CartPole-v1', seed=0,
                                         max_episode_steps=5)
  assert _episode_ends(truncated, policy, 12) == [1.0, 1.0]


def test_the_distinction_reaches_the_buffer(tmp_path):
  env = gymnasium_env.GymnasiumEnv('CartPole-v1', seed=1, max_episode_steps=15)
  with smart_replay.ReplayBufferManager(
      testing.collect_data_spec(env), capacity=1000,
      checkpoint_dir=str(tmp_path / 'b')) as manager:
    _, observer = manager.create_replay_buffer()
    testing.run_actor(observer, 300, env=env,
                      policy=testing.make_policy(env, seed=1))
    batch = []
    for trajectory, _ in manager.epoch(batch_size=64):
      batch.append(trajectory)
  step_type = np.concatenate([t.next_step_type[:, 0] for t in batch])
  discount = np.concatenate([t.discount[:, 0] for t in batch])
  last = step_type == int(ts.StepType.LAST)
  # Falling over (discount 0) and the 15-step limit (discount 1) both occur.
  assert set(discount[last]) == {0.0, 1.0}


def test_unsupported_spaces_are_named():
  with pytest.raises(ValueError, match=r"the observation space .* is not "
                     "supported; expected a gymnasium Box or Discrete"):
    gymnasium_env.GymnasiumEnv('Blackjack-v1')
