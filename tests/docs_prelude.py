"""What the docs' Python blocks take as given, made real for tests/test_docs.py.

A block in the README or in `docs/` shows the lines a user adds to training
code they already have. Its context is built here from real components,
only when the document names it:

* `agent`, `env`, `collect_policy`, `train_step`, `root_dir`: TF-Agents'
  DQN on CartPole (Gymnasium) with its collect policy, as a training script
  has them;
* `atari_agent`: TF-Agents' Atari DQN on Pong (observations `[84, 84, 4]`
  uint8, as in `examples/dqn_atari.py`);
* files the text says exist: the starter buffer the document's own
  `smart-replay-populate --buffer_name=office --num_runs=10` command writes,
  and a plain TF-Agents + Reverb checkpoint in `old/checkpoint_dir`.
"""

import os
import shutil
import subprocess
import sys
from typing import Any, Dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE_NAMES = ('agent', 'env', 'collect_policy', 'train_step', 'root_dir')
STARTER = 'starter_buffers/office_seq2_2880steps'
PLAIN_CHECKPOINT = 'old/checkpoint_dir'


def _cartpole() -> Dict[str, Any]:
  """A DQN agent on CartPole, its environment and collect policy."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_agents.agents.dqn import dqn_agent  # pylint: disable=g-import-not-at-top
  from tf_agents.networks import q_network  # pylint: disable=g-import-not-at-top
  from tf_agents.policies import py_tf_eager_policy  # pylint: disable=g-import-not-at-top
  from tf_agents.train.utils import spec_utils  # pylint: disable=g-import-not-at-top
  from tf_agents.train.utils import train_utils  # pylint: disable=g-import-not-at-top
  from smart_replay.apps.envs import gymnasium_env  # pylint: disable=g-import-not-at-top
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
  return {'agent': agent, 'env': env, 'train_step': train_step,
          'collect_policy': py_tf_eager_policy.PyTFEagerPolicy(
              agent.collect_policy), 'root_dir': 'runs/x'}


def _atari_agent() -> Any:
  """TF-Agents' DQN for Pong's `[84, 84, 4]` uint8 observations."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_agents.agents.dqn import dqn_agent  # pylint: disable=g-import-not-at-top
  from tf_agents.networks import q_network  # pylint: disable=g-import-not-at-top
  from tf_agents.train.utils import spec_utils  # pylint: disable=g-import-not-at-top
  from smart_replay.apps.envs import atari_env  # pylint: disable=g-import-not-at-top
  env = atari_env.make_atari_env('Pong', seed=0, stack_axis=-1)
  observation_spec, action_spec, time_step_spec = (
      spec_utils.get_tensor_specs(env))
  agent = dqn_agent.DqnAgent(
      time_step_spec, action_spec,
      q_network=q_network.QNetwork(
          observation_spec, action_spec,
          preprocessing_layers=tf.keras.layers.Lambda(
              lambda x: tf.cast(x, tf.float32) / 255.0),
          conv_layer_params=((16, 8, 4),), fc_layer_params=(32,)),
      optimizer=tf.keras.optimizers.Adam(1e-4))
  agent.initialize()
  env.close()
  return agent


def _starter_buffer() -> None:
  """The starter `smart-replay-populate --buffer_name=office --num_runs=10`
  writes (the thermal building, its schedule policy)."""
  import smart_replay  # pylint: disable=g-import-not-at-top
  smart_replay.populate_starter_buffer(buffer_name='office', num_runs=10,
                                       show_progress=False)
  assert os.path.isdir(STARTER), STARTER


def _plain_checkpoint() -> None:
  """A checkpoint of TF-Agents' own Reverb buffer for the CartPole agent:
  the first half of examples/takeover.py, which writes it with stock
  TF-Agents and Reverb calls."""
  subprocess.run([sys.executable, os.path.join(ROOT, 'examples/takeover.py'),
                  '--root_dir=_takeover', '--steps=200'], check=True,
                 capture_output=True, timeout=600)
  os.makedirs(os.path.dirname(PLAIN_CHECKPOINT), exist_ok=True)
  shutil.move('_takeover/plain', PLAIN_CHECKPOINT)
  shutil.rmtree('_takeover')


def context(code: str) -> Dict[str, Any]:
  """The names and files the blocks of one document use.

  Args:
    code: every Python block of the document.

  Returns:
    The names to run the blocks with (files are made in the working
    directory).
  """
  names = {}
  if any(name in code for name in CARTPOLE_NAMES):
    names.update(_cartpole())
  if 'atari_agent' in code:
    names['atari_agent'] = _atari_agent()
  if STARTER in code:
    _starter_buffer()
  if PLAIN_CHECKPOINT in code:
    _plain_checkpoint()
  return names


def needs_server(code: str) -> bool:
  """Whether the blocks talk to a standalone server ('buffer-host:8000')."""
  return 'buffer-host:8000' in code
