r"""Offline to online: a starter buffer mixed into every batch, annealed.

A random policy's CartPole steps fill a starter buffer (the offline data).
A DQN agent then trains with a new, empty online buffer that its own
collect policy fills, and each batch draws every element from the starter
with a probability annealed from `--initial_fraction` to `--final_fraction`
over the run (`get_dataset(starter_fraction=FractionSchedule(...))`). The
starter is only read: it is served beside the buffer, recorded in the run's
checkpoints by path and fingerprint, never copied or written.

```bash
python examples/offline_to_online.py --root_dir=/tmp/offline_to_online
```

The elements each source gave are counted as batches are made (from
`info.source`: `smart_replay.ONLINE` or `smart_replay.STARTER`) and logged at
the end.
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

import smart_replay
from smart_replay.apps.envs import gymnasium_env

flags.DEFINE_string('root_dir', None, 'Where the buffers and the agent go.')
flags.DEFINE_integer('starter_steps', 2000, 'Steps of the offline data.')
flags.DEFINE_integer('num_iterations', 2000, 'Train steps.')
flags.DEFINE_float('initial_fraction', 0.8, 'Starter share at the start.')
flags.DEFINE_float('final_fraction', 0.1, 'Starter share at the end.')
flags.mark_flag_as_required('root_dir')
FLAGS = flags.FLAGS


def make_starter(starter_dir: str, data_spec, env, steps: int) -> None:
  """The offline data: a random policy's `steps` steps, checkpointed."""
  with smart_replay.ReplayBufferManager(
      data_spec, capacity=steps, checkpoint_dir=starter_dir) as starter:
    _, observer = starter.create_replay_buffer()
    actor.Actor(env, random_py_policy.RandomPyPolicy(
        env.time_step_spec(), env.action_spec()),
                train_utils.create_train_step(), steps_per_run=steps,
                observers=[observer]).run()
    starter.checkpoint()


def count_sources(dataset: tf.data.Dataset,
                  counts: tf.Variable) -> tf.data.Dataset:
  """The same batches; each adds its elements per source to `counts`.

  `counts` is an int64 variable of shape [2], indexed by `info.source`
  (`smart_replay.ONLINE`, `smart_replay.STARTER`). Batches are counted when
  the dataset makes them (prefetched ones before they are used).
  """
  def count(experience, info):
    counts.assign_add(tf.math.bincount(info.source[:, 0], minlength=2,
                                       maxlength=2, dtype=tf.int64))
    return experience, info
  return dataset.map(count)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.INFO)
  env = gymnasium_env.GymnasiumEnv('CartPole-v1', seed=0)
  observation_spec, action_spec, time_step_spec = (
      spec_utils.get_tensor_specs(env))
  train_step = train_utils.create_train_step()
  agent = dqn_agent.DqnAgent(
      time_step_spec, action_spec,
      q_network=q_network.QNetwork(observation_spec, action_spec),
      optimizer=tf.keras.optimizers.Adam(1e-3),
      train_step_counter=train_step)
  agent.initialize()
  starter_dir = os.path.join(FLAGS.root_dir, 'starter')
  make_starter(starter_dir, agent.collect_data_spec, env, FLAGS.starter_steps)

  # The online buffer is configured like the starter and starts empty.
  manager = smart_replay.ReplayBufferManager.from_checkpoint(
      starter_dir, checkpoint_dir=os.path.join(FLAGS.root_dir, 'buffer'),
      starter_dir=starter_dir)
  _, observer = manager.create_replay_buffer()
  collect_actor = actor.Actor(
      env, py_tf_eager_policy.PyTFEagerPolicy(agent.collect_policy,
                                              use_tf_function=True),
      train_step, steps_per_run=1, observers=[observer])
  for _ in range(64):  # The online table needs items before sampling.
    collect_actor.run()
  manager.flush()
  schedule = smart_replay.FractionSchedule(
      initial=FLAGS.initial_fraction, final=FLAGS.final_fraction,
      steps=FLAGS.num_iterations)
  sources = tf.Variable(tf.zeros([2], tf.int64))  # By ONLINE, STARTER.
  dqn_learner = learner.Learner(
      os.path.join(FLAGS.root_dir, 'train'), train_step, agent,
      lambda: count_sources(manager.get_dataset(
          batch_size=64, num_steps=2, train_step=train_step,
          starter_fraction=schedule), sources))
  for _ in range(FLAGS.num_iterations):
    collect_actor.run()
    dqn_learner.run(iterations=1)
  online = sources[smart_replay.ONLINE].numpy()
  starter = sources[smart_replay.STARTER].numpy()
  logging.info('Sampled %d elements from the online buffer and %d from the '
               'starter (%.0f%%); the online buffer holds %d items.', online,
               starter, 100 * starter / max(1, online + starter),
               manager.num_frames())
  logging.info('Checkpoint (records the starter): %s', manager.checkpoint())
  manager.close()


if __name__ == '__main__':
  app.run(main)
