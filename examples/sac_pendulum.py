r"""SAC on Pendulum, the agent and its replay buffer checkpointed together.

TF-Agents' SAC with the Actor/Learner API; the replay buffer is a
`ReplayBufferManager`. The agent and the buffer are checkpointed together
every `--checkpoint_interval` train steps (`PairedCheckpointer`, a Learner
trigger); running the same command again resumes both from the newest pair,
so a run that was killed continues where its last pair left it.

```bash
python examples/sac_pendulum.py --root_dir=/tmp/sac_pendulum
```

The average return of the greedy policy is logged at the end (about -1,200
untrained; around -200 after 20,000 iterations).
"""

import os

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf
from tf_agents.agents.ddpg import critic_network
from tf_agents.agents.sac import sac_agent
from tf_agents.agents.sac import tanh_normal_projection_network
from tf_agents.networks import actor_distribution_network
from tf_agents.policies import py_tf_eager_policy
from tf_agents.policies import random_py_policy
from tf_agents.train import actor
from tf_agents.train import learner
from tf_agents.train.utils import spec_utils
from tf_agents.train.utils import train_utils

import smart_replay
from smart_replay.apps.envs import gymnasium_env

flags.DEFINE_string('root_dir', None, 'Where the buffer and the agent go.')
flags.DEFINE_integer('initial_steps', 1000, 'Random steps before training.')
flags.DEFINE_integer('num_iterations', 20000, 'Train steps.')
flags.DEFINE_integer('checkpoint_interval', 5000, 'Train steps between '
                     'checkpoints of the agent and the buffer.')
flags.DEFINE_integer('eval_episodes', 3, 'Episodes of the final evaluation.')
flags.mark_flag_as_required('root_dir')
FLAGS = flags.FLAGS


def make_agent(env, train_step: tf.Variable) -> sac_agent.SacAgent:
  """TF-Agents' SAC with two 64-unit layers in both networks."""
  observation_spec, action_spec, time_step_spec = (
      spec_utils.get_tensor_specs(env))
  actor_net = actor_distribution_network.ActorDistributionNetwork(
      observation_spec, action_spec, fc_layer_params=(64, 64),
      continuous_projection_net=(
          tanh_normal_projection_network.TanhNormalProjectionNetwork))
  critic_net = critic_network.CriticNetwork(
      (observation_spec, action_spec), joint_fc_layer_params=(64, 64),
      kernel_initializer='glorot_uniform',
      last_kernel_initializer='glorot_uniform')
  agent = sac_agent.SacAgent(
      time_step_spec, action_spec, actor_network=actor_net,
      critic_network=critic_net,
      actor_optimizer=tf.keras.optimizers.Adam(3e-4),
      critic_optimizer=tf.keras.optimizers.Adam(3e-4),
      alpha_optimizer=tf.keras.optimizers.Adam(3e-4),
      target_update_tau=0.005, gamma=0.99, train_step_counter=train_step)
  agent.initialize()
  return agent


def train_eval(root_dir: str, *, initial_steps: int, num_iterations: int,
               checkpoint_interval: int, eval_episodes: int) -> float:
  """Trains (or resumes) SAC; returns the greedy policy's average return."""
  collect_env = gymnasium_env.GymnasiumEnv('Pendulum-v1', seed=0)
  eval_env = gymnasium_env.GymnasiumEnv('Pendulum-v1', seed=1)
  train_step = train_utils.create_train_step()
  agent = make_agent(collect_env, train_step)

  buffer_dir = os.path.join(root_dir, 'buffer')
  agent_dir = os.path.join(root_dir, 'agent')
  manager = smart_replay.ReplayBufferManager(
      agent.collect_data_spec, capacity=100_000, checkpoint_dir=buffer_dir,
      sequence_length=2)
  checkpointer = smart_replay.PairedCheckpointer(
      manager, agent_dir=agent_dir, train_step=train_step,
      interval=checkpoint_interval, agent=agent)
  pair = smart_replay.newest_pair(buffer_dir, agent_dir)
  if pair is None:
    _, observer = manager.create_replay_buffer()
    actor.Actor(collect_env, random_py_policy.RandomPyPolicy(
        collect_env.time_step_spec(), collect_env.action_spec()),
                train_step, steps_per_run=initial_steps,
                observers=[observer]).run()
  else:
    _, observer = manager.load_replay_buffer(pair.buffer_checkpoint)
    checkpointer.restore_agent(pair)
    logging.info('Resumed at train step %d', int(train_step.numpy()))

  collect_actor = actor.Actor(
      collect_env, py_tf_eager_policy.PyTFEagerPolicy(
          agent.collect_policy, use_tf_function=True),
      train_step, steps_per_run=1, observers=[observer])
  sac_learner = learner.Learner(
      os.path.join(root_dir, 'train'), train_step, agent,
      lambda: manager.get_dataset(batch_size=256, num_steps=2),
      checkpoint_interval=-1, triggers=[checkpointer])
  while int(train_step.numpy()) < num_iterations:
    collect_actor.run()
    sac_learner.run(iterations=1)

  greedy = py_tf_eager_policy.PyTFEagerPolicy(agent.policy,
                                              use_tf_function=True)
  total = 0.0
  for _ in range(eval_episodes):
    time_step = eval_env.reset()
    while not time_step.is_last():
      time_step = eval_env.step(greedy.action(time_step).action)
      total += float(time_step.reward)
  logging.info('Average return at train step %d: %.1f',
               int(train_step.numpy()), total / eval_episodes)
  checkpointer.save_unless_saved()
  manager.close()
  return total / eval_episodes


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.INFO)
  train_eval(FLAGS.root_dir, initial_steps=FLAGS.initial_steps,
             num_iterations=FLAGS.num_iterations,
             checkpoint_interval=FLAGS.checkpoint_interval,
             eval_episodes=FLAGS.eval_episodes)


if __name__ == '__main__':
  app.run(main)
