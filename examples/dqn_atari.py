# coding=utf-8
# Copyright 2020 The TF-Agents Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Modified for smart_replay: a copy of TF-Agents 0.19's
# tf_agents/examples/dqn/mnih15/dqn_train_eval_atari.py in which only the
# blocks between `# smart_replay: ...` and `# end of smart_replay` comments
# differ: the environment (Gymnasium + ale-py instead of suite_atari, which
# needs the old gym Atari) and the replay buffer (ReplayBufferManager instead
# of a hand-made reverb.Table/Server/ReverbReplayBuffer/observer), plus a flag
# parser that exits 2 on a bad flag and 0 on --help.

r"""Example training DQN using actor/learner in an Atari environment.

To run DQN on Pong following the hyperparameters from
"Human level control through deep reinforcement learning" (Mnih et al., 2015)
https://storage.googleapis.com/deepmind-media/dqn/DQNNaturePaper.pdf

```bash
tensorboard --logdir /tmp/dqn_pong --port 2223 &
python examples/dqn_atari.py --root_dir=/tmp/dqn_pong
```

TF-Agents' DQN on Pong with its Reverb replay buffer replaced by
`smart_replay.ReplayBufferManager`: each 84x84 frame of the stacked
observations is stored once (the manager finds the stack by its shape, no
option needed), and the buffer is checkpointed with the agent (every
`train_eval.checkpoint_interval` train steps) into <root_dir>/replay_buffer;
running the same command again resumes from the newest checkpoints. Pong
comes from Gymnasium + ale-py (the atari extra: `pip install -e
'.[atari]'`), preprocessed as TF-Agents' suite_atari does (sticky actions,
4-frame skip with max-pooling, 84x84 grayscale, 4 frames stacked on the last
axis).

A short run (a few minutes on 2 cores; no learning expected):

```bash
python examples/dqn_atari.py --root_dir=/tmp/dqn_pong_short \
  --num_iterations=300 --eval_interval=0 \
  --gin_bindings=train_eval.initial_collect_steps=500 \
  --gin_bindings=train_eval.replay_capacity=10000 \
  --gin_bindings=train_eval.checkpoint_interval=100
```
"""
import functools
import os
import sys

from absl import app
from absl import flags
from absl import logging
import gin
import tensorflow.compat.v2 as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.environments import wrappers
from tf_agents.metrics import py_metrics
from tf_agents.networks import sequential
from tf_agents.policies import py_tf_eager_policy
from tf_agents.policies import random_py_policy
from tf_agents.system import system_multiprocessing as multiprocessing
from tf_agents.train import actor
from tf_agents.train import interval_trigger
from tf_agents.train import learner
from tf_agents.train import triggers
from tf_agents.train.utils import spec_utils
from tf_agents.train.utils import train_utils
from tf_agents.utils import common

import smart_replay
from smart_replay.apps.envs import atari_env

# smart_replay loads its public names on first use; using one here loads the
# manager and registers its gin configurables (ReplayBufferManager, FrameStack,
# the option groups), which must exist before gin parses the bindings: parsing
# locks the config, and a configurable registered later is refused.
smart_replay.ReplayBufferManager  # pylint: disable=pointless-statement

FLAGS = flags.FLAGS

flags.DEFINE_string(
    'root_dir',
    os.getenv('TEST_UNDECLARED_OUTPUTS_DIR'),
    'Root directory for writing logs/summaries/checkpoints.',
)
flags.DEFINE_integer(
    'reverb_port',
    None,
    'Port for reverb server, if None, use a randomly chosen unused port.',
)
flags.DEFINE_integer(
    'num_iterations',
    50000000,
    'Total number iterations to perform, defaults to 50M collect steps.',
)
flags.DEFINE_integer(
    'eval_interval',
    250000,
    'Number of train steps between evaluations. Set to 0 to skip.',
)
flags.DEFINE_multi_string('gin_file', None, 'Paths to the gin-config files.')
flags.DEFINE_multi_string('gin_bindings', None, 'Gin binding parameters.')


def create_q_network(num_actions):
  """Create a Q network following the architecture from Minh 15."""

  kernel_initializer = tf.keras.initializers.VarianceScaling(scale=2.0)
  conv2d = functools.partial(
      tf.keras.layers.Conv2D,
      activation=tf.keras.activations.relu,
      kernel_initializer=kernel_initializer,
  )
  dense = functools.partial(
      tf.keras.layers.Dense,
      activation=tf.keras.activations.relu,
      kernel_initializer=kernel_initializer,
  )
  logits = functools.partial(
      tf.keras.layers.Dense,
      activation=None,
      kernel_initializer=kernel_initializer,
  )

  return sequential.Sequential(
      # We divide the grayscale pixel values by 255 here rather than storing
      # normalized values because uint8s are 4x cheaper to store than float32s.
      [
          tf.keras.layers.Lambda(lambda x: x / 255),
          conv2d(32, (8, 8), 4),
          conv2d(64, (4, 4), 2),
          conv2d(64, (3, 3), 1),
          tf.keras.layers.Flatten(),
          dense(512),
          logits(num_actions),
      ]
  )


# smart_replay: the environment. TF-Agents' suite_atari.load(env_name,
# max_episode_steps, DEFAULT_ATARI_GYM_WRAPPERS_WITH_STACKING) needs the old
# gym Atari; this is the same game from Gymnasium + ale-py (ALE/<Game>-v5,
# sticky actions, AtariPreprocessing, 4 frames stacked on the last axis:
# uint8[84, 84, 4]) behind the same agent-step time limit.
def load_atari(env_name, max_episode_steps):
  """Pong (or another ALE game) as suite_atari would load it."""
  game = env_name.split('-')[0]  # 'Pong-v0' (suite_atari's id) -> 'Pong'.
  env = atari_env.make_atari_env(game, seed=None, stack_axis=-1)
  return wrappers.TimeLimit(env, duration=max_episode_steps)
# end of smart_replay: the environment.


@gin.configurable
def train_eval(
    root_dir,
    env_name='Pong-v0',
    # Training params
    update_frequency=4,  # Number of collect steps per policy update
    initial_collect_steps=50000,  # 50k collect steps
    num_iterations=50000000,  # 50M collect steps
    # Taken from Rainbow as it's not specified in Mnih,15.
    max_episode_frames_collect=50000,  # env frames observed by the agent
    max_episode_frames_eval=108000,  # env frames observed by the agent
    # Agent params
    epsilon_greedy=0.1,
    epsilon_decay_period=250000,  # 1M collect steps / update_frequency
    batch_size=32,
    learning_rate=0.00025,
    n_step_update=1,
    gamma=0.99,
    target_update_tau=1.0,
    target_update_period=2500,  # 10k collect steps / update_frequency
    reward_scale_factor=1.0,
    # Replay params
    reverb_port=None,
    replay_capacity=1000000,
    # smart_replay: train steps between checkpoints of the agent (the
    # Learner's default) and now also of the replay buffer.
    checkpoint_interval=100000,
    # Others
    policy_save_interval=250000,
    eval_interval=1000,
    eval_episodes=30,
    debug_summaries=True,
):
  """Trains and evaluates DQN."""

  # smart_replay: the environment (see load_atari).
  collect_env = load_atari(
      env_name,
      max_episode_steps=max_episode_frames_collect,
  )
  eval_env = load_atari(
      env_name,
      max_episode_steps=max_episode_frames_eval,
  )
  # end of smart_replay: the environment.

  unused_observation_tensor_spec, action_tensor_spec, time_step_tensor_spec = (
      spec_utils.get_tensor_specs(collect_env)
  )

  train_step = train_utils.create_train_step()

  num_actions = action_tensor_spec.maximum - action_tensor_spec.minimum + 1
  epsilon = tf.compat.v1.train.polynomial_decay(
      1.0, train_step, epsilon_decay_period, end_learning_rate=epsilon_greedy
  )
  agent = dqn_agent.DqnAgent(
      time_step_tensor_spec,
      action_tensor_spec,
      q_network=create_q_network(num_actions),
      epsilon_greedy=epsilon,
      n_step_update=n_step_update,
      target_update_tau=target_update_tau,
      target_update_period=target_update_period,
      optimizer=tf.keras.optimizers.RMSprop(
          learning_rate=learning_rate,
          rho=0.95,
          momentum=0.95,
          epsilon=0.01,
          centered=True,
      ),
      td_errors_loss_fn=common.element_wise_huber_loss,
      gamma=gamma,
      reward_scale_factor=reward_scale_factor,
      train_step_counter=train_step,
      debug_summaries=debug_summaries,
  )

  # smart_replay: the replay buffer. Replaces TF-Agents' reverb.Table
  # (uniform sampling, FIFO removal, MinSize(1)), reverb.Server,
  # ReverbReplayBuffer, ReverbAddTrajectoryObserver and as_dataset; adds a
  # checkpoint of the buffer next to each of the Learner's (TF-Agents'
  # ReverbCheckpointTrigger in its other examples) and resumes from the
  # newest one.
  sequence_length = n_step_update + 1
  manager = smart_replay.ReplayBufferManager(
      agent.collect_data_spec,
      capacity=replay_capacity,
      checkpoint_dir=os.path.join(root_dir, 'replay_buffer'),
      sequence_length=sequence_length,
      port=reverb_port,
  )
  if manager.existing_checkpoints():
    reverb_replay, rb_observer = manager.load_replay_buffer()
    logging.info('Resumed the replay buffer from %s (%d items).',
                 manager.loaded_checkpoint, manager.num_frames())
  else:
    reverb_replay, rb_observer = manager.create_replay_buffer()
  del reverb_replay  # Sampled through manager.get_dataset.

  dataset = manager.get_dataset(batch_size=batch_size, num_steps=2, prefetch=3)
  experience_dataset_fn = lambda: dataset

  def checkpoint_replay_buffer():
    path = manager.checkpoint(extra={'train_step': int(train_step.numpy())})
    logging.info('Checkpointed the replay buffer to %s', path)

  replay_checkpoint_trigger = interval_trigger.IntervalTrigger(
      checkpoint_interval, checkpoint_replay_buffer
  )
  # end of smart_replay: the replay buffer.

  saved_model_dir = os.path.join(root_dir, learner.POLICY_SAVED_MODEL_DIR)
  env_step_metric = py_metrics.EnvironmentSteps()

  learning_triggers = [
      triggers.PolicySavedModelTrigger(
          saved_model_dir,
          agent,
          train_step,
          interval=policy_save_interval,
          metadata_metrics={triggers.ENV_STEP_METADATA_KEY: env_step_metric},
      ),
      triggers.StepPerSecondLogTrigger(train_step, interval=100),
      replay_checkpoint_trigger,  # smart_replay: the buffer's checkpoints.
  ]

  dqn_learner = learner.Learner(
      root_dir,
      train_step,
      agent,
      experience_dataset_fn,
      triggers=learning_triggers,
      checkpoint_interval=checkpoint_interval,  # smart_replay: as the buffer's.
  )

  # If we haven't trained yet make sure we collect some random samples first to
  # fill up the Replay Buffer with some experience.
  random_policy = random_py_policy.RandomPyPolicy(
      collect_env.time_step_spec(), collect_env.action_spec()
  )
  initial_collect_actor = actor.Actor(
      collect_env,
      random_policy,
      train_step,
      steps_per_run=initial_collect_steps,
      observers=[rb_observer],
  )
  logging.info('Doing initial collect.')
  initial_collect_actor.run()

  tf_collect_policy = agent.collect_policy
  collect_policy = py_tf_eager_policy.PyTFEagerPolicy(
      tf_collect_policy, use_tf_function=True
  )

  collect_actor = actor.Actor(
      collect_env,
      collect_policy,
      train_step,
      steps_per_run=update_frequency,
      observers=[rb_observer, env_step_metric],
      metrics=actor.collect_metrics(10),
      reference_metrics=[env_step_metric],
      summary_dir=os.path.join(root_dir, learner.TRAIN_DIR),
  )

  tf_greedy_policy = agent.policy
  greedy_policy = py_tf_eager_policy.PyTFEagerPolicy(
      tf_greedy_policy, use_tf_function=True
  )

  eval_actor = actor.Actor(
      eval_env,
      greedy_policy,
      train_step,
      episodes_per_run=eval_episodes,
      metrics=actor.eval_metrics(eval_episodes),
      reference_metrics=[env_step_metric],
      summary_dir=os.path.join(root_dir, 'eval'),
  )

  if eval_interval:
    logging.info('Evaluating.')
    eval_actor.run_and_log()

  logging.info('Training.')
  for _ in range(num_iterations):
    collect_actor.run()
    dqn_learner.run(iterations=1)

    if eval_interval and dqn_learner.train_step_numpy % eval_interval == 0:
      logging.info('Evaluating.')
      eval_actor.run_and_log()

  # smart_replay: closing the buffer (was reverb_server.stop()).
  rb_observer.close()
  manager.close()
  # end of smart_replay: closing the buffer.


def main(_):
  gin.parse_config_files_and_bindings(FLAGS.gin_file, FLAGS.gin_bindings)

  train_eval(
      FLAGS.root_dir,
      num_iterations=FLAGS.num_iterations,
      reverb_port=FLAGS.reverb_port,
      eval_interval=FLAGS.eval_interval,
  )


# smart_replay: absl exits 1 on a bad flag and on --help; a bad or missing
# flag exits 2 here, --help prints this file's docstring and flags and exits 0.
_HELP = ('--help', '-h', '-?', '--helpshort', '--helpfull')


def parse_flags(argv):
  """absl's flag parsing with exit codes 0 for --help and 2 for bad flags."""
  args = argv[1:argv.index('--')] if '--' in argv else argv[1:]
  wanted = [arg for arg in args if arg in _HELP]
  if wanted:
    app.usage(shorthelp='--helpfull' not in wanted, writeto_stdout=True,
              exitcode=0)
  try:
    return FLAGS(argv)
  except flags.Error as e:
    sys.stderr.write(f'FATAL Flags parsing error: {e}\n'
                     f'Pass --help to see help on flags.\n')
    sys.exit(2)
# end of smart_replay: the flag parser.


if __name__ == '__main__':
  flags.mark_flag_as_required('root_dir')
  multiprocessing.handle_main(
      functools.partial(app.run, main), flags_parser=parse_flags
  )
