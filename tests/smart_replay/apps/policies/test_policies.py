"""Tests for the baseline policies and their factory."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.networks import q_network
from tf_agents.policies import policy_saver
from tf_agents.policies import random_py_policy
from tf_agents.specs import tensor_spec

from smart_replay.apps.envs import factory as env_factory
from smart_replay.apps.policies import cartpole
from smart_replay.apps.policies import factory
from smart_replay.apps.policies import thermostat


def _mean_episode_length(env, policy, episodes=5):
  lengths = []
  for _ in range(episodes):
    time_step, n = env.reset(), 0
    while not time_step.is_last():
      time_step = env.step(policy.action(time_step).action)
      n += 1
    lengths.append(n)
  return np.mean(lengths)


def test_baseline_resolves_per_environment():
  thermal_env = env_factory.make_environment('thermal')
  assert isinstance(factory.make_policy(env=thermal_env),
                    thermostat.SchedulePolicy)
  cartpole_env = env_factory.make_environment('gym:CartPole-v1')
  assert isinstance(factory.make_policy(env=cartpole_env),
                    cartpole.CartPoleBalancePolicy)
  acrobot = env_factory.make_environment('gym:Acrobot-v1')
  assert isinstance(factory.make_policy(env=acrobot),
                    random_py_policy.RandomPyPolicy)


def test_scripted_cartpole_outlasts_random():
  env = env_factory.make_environment('gym:CartPole-v1', seed=0)
  scripted = _mean_episode_length(env, factory.make_policy('scripted', env=env))
  random = _mean_episode_length(env, factory.make_policy('random', env=env))
  assert scripted > 3 * random


def test_saved_policy_directory(tmp_path):
  env = env_factory.make_environment('gym:CartPole-v1', seed=0)
  agent = dqn_agent.DqnAgent(
      tensor_spec.from_spec(env.time_step_spec()),
      tensor_spec.from_spec(env.action_spec()),
      q_network=q_network.QNetwork(
          tensor_spec.from_spec(env.observation_spec()),
          tensor_spec.from_spec(env.action_spec()), fc_layer_params=(8,)),
      optimizer=tf.keras.optimizers.Adam())
  agent.initialize()
  policy_saver.PolicySaver(agent.policy).save(str(tmp_path / 'policy'))
  loaded = factory.make_policy(
      factory.saved_policy_kind(str(tmp_path / 'policy')), env=env)
  action = loaded.action(env.reset()).action
  assert action.shape == () and action in (0, 1)


def test_saved_policy_keeps_its_policy_info_and_must_fit(tmp_path):
  from tf_agents.policies import random_tf_policy  # pylint: disable=g-import-not-at-top
  env = env_factory.make_environment('gym:CartPole-v1', seed=0)
  policy = random_tf_policy.RandomTFPolicy(
      tensor_spec.from_spec(env.time_step_spec()),
      tensor_spec.from_spec(env.action_spec()), emit_log_probability=True)
  policy_saver.PolicySaver(policy).save(str(tmp_path / 'p'))
  loaded = factory.make_policy(f'saved:{tmp_path / "p"}', env=env)
  assert 'log_probability' in str(loaded.collect_data_spec.policy_info)
  step = loaded.action(env.reset())
  assert [x.shape for x in tf.nest.flatten(step.info)] == [()]
  thermal_env = env_factory.make_environment('thermal')
  with pytest.raises(ValueError, match=r'(?s)does not fit this environment.*'
                     r'time_step/observation: environment float32\[5\], '
                     r'policy float32\[4\].*action: environment float32\[1\]'
                     r', policy int64\[\]'):
    factory.make_policy(f'saved:{tmp_path / "p"}', env=thermal_env)


@pytest.mark.parametrize('kind, env_name, match', [
    ('nope', 'thermal', "unknown policy 'nope'"),
    ('schedule', 'gym:CartPole-v1', "'schedule' needs the thermal"),
    ('scripted', 'thermal', 'no scripted policy for ThermalZoneEnv'),
    ('saved:/no/such/dir', 'thermal', "'/no/such/dir' has no saved_model.pb"),
])
def test_bad_policies_are_named(kind, env_name, match):
  env = env_factory.make_environment(env_name)
  with pytest.raises(ValueError, match=match):
    factory.make_policy(kind, env=env)


def test_schedule_policy_rejects_bad_gain():
  env = env_factory.make_environment('thermal')
  with pytest.raises(ValueError, match='gain must be > 0, got 0'):
    thermostat.SchedulePolicy(env.time_step_spec(), env.action_spec(), gain=0)
