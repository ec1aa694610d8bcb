"""Agent factories for training from a starter buffer: DQN and SAC."""

from typing import Sequence

import gin
import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.agents.ddpg import critic_network
from tf_agents.agents.dqn import dqn_agent
from tf_agents.agents.sac import sac_agent
from tf_agents.agents.sac import tanh_normal_projection_network
from tf_agents.networks import actor_distribution_network
from tf_agents.networks import q_network
from tf_agents.specs import tensor_spec
from tf_agents.utils import common

KINDS = ('auto', 'dqn', 'sac')


@gin.configurable
def make_dqn_agent(time_step_spec, action_spec, train_step: tf.Variable, *,
                   fc_layer_params: Sequence[int] = (64, 64),
                   learning_rate: float = 1e-3, epsilon_greedy: float = 0.1,
                   target_update_period: int = 100, gamma: float = 0.99
                   ) -> tf_agent.TFAgent:
  """Builds a DQN agent for a discrete action.

  Args:
    time_step_spec: the environment's time step spec (tensor specs).
    action_spec: a scalar integer bounded spec.
    train_step: the train step counter.
    fc_layer_params: Q-network hidden layers.
    learning_rate: Adam learning rate.
    epsilon_greedy: exploration of the collect policy.
    target_update_period: train steps between target network updates.
    gamma: discount.

  Returns:
    An initialized `DqnAgent`.
  """
  network = q_network.QNetwork(time_step_spec.observation, action_spec,
                               fc_layer_params=tuple(fc_layer_params))
  agent = dqn_agent.DqnAgent(
      time_step_spec, action_spec, q_network=network,
      optimizer=tf.keras.optimizers.Adam(learning_rate),
      epsilon_greedy=epsilon_greedy, target_update_period=target_update_period,
      td_errors_loss_fn=common.element_wise_huber_loss, gamma=gamma,
      train_step_counter=train_step)
  agent.initialize()
  return agent


@gin.configurable
def make_sac_agent(time_step_spec, action_spec, train_step: tf.Variable, *,
                   fc_layer_params: Sequence[int] = (64, 64),
                   learning_rate: float = 3e-4, gamma: float = 0.99,
                   target_update_tau: float = 0.005,
                   reward_scale_factor: float = 1.0) -> tf_agent.TFAgent:
  """Builds a SAC agent for a continuous (bounded) action.

  Args:
    time_step_spec: the environment's time step spec (tensor specs).
    action_spec: a bounded float spec.
    train_step: the train step counter.
    fc_layer_params: hidden layers of the actor and the critic.
    learning_rate: Adam learning rate of actor, critic and alpha.
    gamma: discount.
    target_update_tau: soft target update rate.
    reward_scale_factor: reward scale.

  Returns:
    An initialized `SacAgent`.
  """
  observation_spec = time_step_spec.observation
  critic = critic_network.CriticNetwork(
      (observation_spec, action_spec),
      joint_fc_layer_params=tuple(fc_layer_params),
      kernel_initializer='glorot_uniform',
      last_kernel_initializer='glorot_uniform')
  actor = actor_distribution_network.ActorDistributionNetwork(
      observation_spec, action_spec, fc_layer_params=tuple(fc_layer_params),
      continuous_projection_net=(
          tanh_normal_projection_network.TanhNormalProjectionNetwork))
  agent = sac_agent.SacAgent(
      time_step_spec, action_spec, actor_network=actor, critic_network=critic,
      actor_optimizer=tf.keras.optimizers.Adam(learning_rate),
      critic_optimizer=tf.keras.optimizers.Adam(learning_rate),
      alpha_optimizer=tf.keras.optimizers.Adam(learning_rate),
      target_update_tau=target_update_tau, target_update_period=1,
      td_errors_loss_fn=tf.math.squared_difference, gamma=gamma,
      reward_scale_factor=reward_scale_factor, train_step_counter=train_step)
  agent.initialize()
  return agent


@gin.configurable
def make_agent(kind: str = 'auto', *, time_step_spec, action_spec,
               train_step: tf.Variable) -> tf_agent.TFAgent:
  """Builds the agent to train.

  Args:
    kind: 'dqn', 'sac', or 'auto' (DQN for a discrete action, SAC otherwise).
    time_step_spec: the environment's time step spec (array or tensor specs).
    action_spec: the environment's action spec.
    train_step: the train step counter.

  Returns:
    An initialized TF-Agents agent.

  Raises:
    ValueError: if `kind` is unknown or does not fit the action spec.
  """
  time_step_spec = tensor_spec.from_spec(time_step_spec)
  action_spec = tensor_spec.from_spec(action_spec)
  discrete = action_spec.dtype.is_integer
  if kind == 'auto':
    kind = 'dqn' if discrete else 'sac'
  if kind == 'dqn':
    if not discrete or action_spec.shape.rank:
      raise ValueError(f"agent 'dqn' needs a scalar discrete action, the "
                       f'environment has {action_spec}.')
    return make_dqn_agent(time_step_spec, action_spec, train_step)
  if kind == 'sac':
    if discrete:
      raise ValueError(f"agent 'sac' needs a continuous action, the "
                       f'environment has {action_spec}.')
    return make_sac_agent(time_step_spec, action_spec, train_step)
  raise ValueError(f'unknown agent {kind!r}; expected one of {KINDS}.')
