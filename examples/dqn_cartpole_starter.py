r"""DQN on CartPole, trained from a starter buffer a random policy filled.

The two steps of training from a starter buffer, with TF-Agents' Actor and
Learner:

1. A random policy fills a starter buffer (`ReplayBufferManager` +
   `create_replay_buffer`, the Actor's observer, `checkpoint`).
2. A DQN agent trains from it: a new buffer configured like the starter
   (`ReplayBufferManager.from_checkpoint`) loads the starter's items
   (`load_replay_buffer(starter)`; the starter itself is only read), the
   collect Actor adds new steps, the Learner samples `get_dataset`.

```bash
python examples/dqn_cartpole_starter.py --root_dir=/tmp/dqn_cartpole
```

The average return of the greedy policy is logged before and after training
(about 20 with random weights; well above 100 after the default 4,000
iterations).
"""

import os

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.networks import q_network
from tf_agents.policies import py_tf_eager_policy
from tf_agents.policies import random_py_policy
from tf_agents.train import actor
from tf_agents.train import learner
from tf_agents.train.utils import spec_utils
from tf_agents.train.utils import train_utils
from tf_agents.utils import common

import smart_replay
from smart_replay.apps.envs import gymnasium_env

flags.DEFINE_string('root_dir', None, 'Where the buffers and the agent go.')
flags.DEFINE_integer('starter_steps', 2000, 'Steps the random policy writes.')
flags.DEFINE_integer('num_iterations', 4000, 'Train steps.')
flags.DEFINE_integer('eval_episodes', 10, 'Episodes of each evaluation.')
flags.mark_flag_as_required('root_dir')
FLAGS = flags.FLAGS


def average_return(env, policy, episodes: int) -> float:
  """The mean undiscounted return of `policy` over `episodes` episodes."""
  total = 0.0
  for _ in range(episodes):
    time_step = env.reset()
    while not time_step.is_last():
      time_step = env.step(policy.action(time_step).action)
      total += float(time_step.reward)
  return total / episodes


def fill_starter(starter_dir: str, data_spec, env, steps: int) -> str:
  """A random policy's `steps` steps, checkpointed into `starter_dir`; the
  buffer has room for the training run that continues it."""
  with smart_replay.ReplayBufferManager(
      data_spec, capacity=50_000, checkpoint_dir=starter_dir,
      sequence_length=2) as starter:
    _, observer = starter.create_replay_buffer()
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(),
                                             env.action_spec())
    actor.Actor(env, policy, train_utils.create_train_step(),
                steps_per_run=steps, observers=[observer]).run()
    return starter.checkpoint()


def train_eval(root_dir: str, *, starter_steps: int, num_iterations: int,
               eval_episodes: int) -> float:
  """Fills a starter buffer, trains DQN from it; returns the final return."""
  collect_env = gymnasium_env.GymnasiumEnv('CartPole-v1', seed=0)
  eval_env = gymnasium_env.GymnasiumEnv('CartPole-v1', seed=1)
  observation_spec, action_spec, time_step_spec = (
      spec_utils.get_tensor_specs(collect_env))
  train_step = train_utils.create_train_step()
  agent = dqn_agent.DqnAgent(
      time_step_spec, action_spec,
      q_network=q_network.QNetwork(observation_spec, action_spec,
                                   fc_layer_params=(64, 64)),
      optimizer=tf.keras.optimizers.Adam(1e-3), epsilon_greedy=0.1,
      target_update_period=100,
      td_errors_loss_fn=common.element_wise_huber_loss,
      train_step_counter=train_step)
  agent.initialize()

  starter = os.path.join(root_dir, 'starter')
  logging.info('Starter buffer: %s',
               fill_starter(starter, agent.collect_data_spec, collect_env,
                            starter_steps))

  # A new buffer like the starter, in its own directory; the starter is read.
  manager = smart_replay.ReplayBufferManager.from_checkpoint(
      starter, checkpoint_dir=os.path.join(root_dir, 'buffer'))
  _, observer = manager.load_replay_buffer(starter)
  collect_actor = actor.Actor(
      collect_env, py_tf_eager_policy.PyTFEagerPolicy(
          agent.collect_policy, use_tf_function=True),
      train_step, steps_per_run=1, observers=[observer])
  dqn_learner = learner.Learner(
      os.path.join(root_dir, 'train'), train_step, agent,
      lambda: manager.get_dataset(batch_size=64, num_steps=2))
  greedy = py_tf_eager_policy.PyTFEagerPolicy(agent.policy,
                                              use_tf_function=True)
  logging.info('Average return before training: %.1f',
               average_return(eval_env, greedy, eval_episodes))
  for _ in range(num_iterations):
    collect_actor.run()
    dqn_learner.run(iterations=1)
  final = average_return(eval_env, greedy, eval_episodes)
  logging.info('Average return after %d iterations: %.1f (%d items in the '
               'buffer)', num_iterations, final, manager.num_frames())
  manager.checkpoint(extra={'train_step': int(train_step.numpy())})
  manager.close()
  return final


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.INFO)
  train_eval(FLAGS.root_dir, starter_steps=FLAGS.starter_steps,
             num_iterations=FLAGS.num_iterations,
             eval_episodes=FLAGS.eval_episodes)


if __name__ == '__main__':
  app.run(main)
