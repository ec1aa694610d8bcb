"""Shared test helpers: real TF-Agents environments, policies and specs; real Reverb.

Imported by tests as `from tests import testing`; the pytest fixtures built on
them are in `conftest.py`.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tree
from tf_agents.environments import random_py_environment
from tf_agents.policies import random_py_policy
from tf_agents.specs import array_spec
from tf_agents.specs import tensor_spec
from tf_agents.train import actor
from tf_agents.train.utils import train_utils
from tf_agents.trajectories import trajectory as trajectory_lib


# The repository root (configs/, scripts/, setup.py).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OBSERVATION_SPEC = {
    'temperature': array_spec.BoundedArraySpec((3,), np.float32, -10., 40.,
                                               'temperature'),
    'occupancy': array_spec.BoundedArraySpec((), np.int32, 0, 10, 'occupancy'),
}
ACTION_SPEC = array_spec.BoundedArraySpec((1,), np.float32, -1.0, 1.0, 'hvac')
INFO_SPEC = {'log_probability': array_spec.ArraySpec((), np.float32)}


def make_env(seed=0, max_duration=12):
  """A real TF-Agents PyEnvironment with dict observations, variable episodes."""
  return random_py_environment.RandomPyEnvironment(
      OBSERVATION_SPEC, ACTION_SPEC, episode_end_probability=0.15,
      reward_fn=lambda step_type, action, obs: np.float32(
          obs['temperature'].sum()),
      seed=seed, min_duration=2, max_duration=max_duration)


def make_policy(env, seed=0):
  """A real TF-Agents random policy that emits `policy_info`."""
  return random_py_policy.RandomPyPolicy(
      env.time_step_spec(), env.action_spec(), info_spec=INFO_SPEC, seed=seed)


def collect_data_spec(env):
  """The `collect_data_spec` of `make_policy(env)` (what its agent would have)."""
  return tensor_spec.from_spec(make_policy(env).collect_data_spec)


class Recorder:
  """An Actor observer keeping every trajectory (to compute expected items)."""

  def __init__(self):
    self.steps = []

  def __call__(self, trajectory):
    self.steps.append(tree.map_structure(np.array, trajectory))

  @property
  def env_steps(self):
    """Recorded steps that are not episode boundaries, per environment."""
    return int(sum(np.sum(np.asarray(s.step_type) != 2) for s in self.steps))


def expected_items(steps, sequence_length, stride_length=1):
  """Items a correct observer makes from `steps`: windows within one episode.

  An episode ends at a boundary step, or when a FIRST step arrives (the
  environment was reset mid-episode, e.g. by a new Actor).
  """
  items, episode = [], []
  for step in steps:
    if step.is_first() and episode:
      episode = []
    episode.append(step)
    excess = len(episode) - sequence_length
    if excess >= 0 and excess % stride_length == 0:
      items.append(episode[-sequence_length:])
    if step.is_boundary():
      episode = []
  return [tree.map_structure(lambda *xs: np.stack(xs), *item) for item in items]


def cartpole_dqn(steps):
  """A real DQN agent on CartPole and a random actor for `steps` steps.

  Returns:
    `(agent, train_step, collect(observer))`, where `collect` runs a
    `tf_agents.train.Actor` with a random policy into `observer`.
  """
  from tf_agents.environments import suite_gym  # pylint: disable=g-import-not-at-top
  from smart_replay.apps import agents  # pylint: disable=g-import-not-at-top
  env = suite_gym.load('CartPole-v1')
  train_step = train_utils.create_train_step()
  agent = agents.make_dqn_agent(tensor_spec.from_spec(env.time_step_spec()),
                                tensor_spec.from_spec(env.action_spec()),
                                train_step, fc_layer_params=(16,))
  policy = random_py_policy.RandomPyPolicy(env.time_step_spec(),
                                           env.action_spec())

  def collect(observer):
    actor.Actor(env, policy, train_step, steps_per_run=steps,
                observers=[observer]).run()
    observer.flush()
  return agent, train_step, collect


def item_fingerprint(item):
  """A hashable fingerprint of an item's content (all leaves, in order)."""
  return tuple(np.asarray(leaf).tobytes() for leaf in tree.flatten(item))


def run_actor(manager_observer, steps, seed=0, env=None, policy=None):
  """Runs a real `tf_agents.train.Actor` for `steps` steps; returns the record.

  The default policy is `make_policy(env)` (random, with policy_info).
  """
  env = env or make_env(seed)
  recorder = Recorder()
  collect = actor.Actor(env, policy or make_policy(env, seed),
                        train_utils.create_train_step(),
                        steps_per_run=steps,
                        observers=[manager_observer, recorder])
  collect.run()
  return recorder


def sample_all_items(manager, batch_size=32, max_batches=400):
  """Samples until every stored item was seen; returns {key: fingerprint}."""
  size = manager.num_frames()
  seen = {}
  for i, (trajectory, info) in enumerate(
      manager.get_dataset(batch_size=batch_size, sample_timeout_s=10)):
    keys = info.key[:, 0].numpy()
    batch = tree.map_structure(lambda t: t.numpy(), trajectory)  # Once.
    for b, key in enumerate(keys):
      seen[int(key)] = item_fingerprint(
          tree.map_structure(lambda t: t[b], batch))  # pylint: disable=cell-var-from-loop
    if len(seen) >= size or i >= max_batches:
      break
  return seen


def dir_digest(path):
  """{relative file path: bytes} of everything under `path`, except the
  `.lock` file (it records who holds the buffer open, not its data)."""
  out = {}
  for root, _, files in os.walk(path):
    for name in files:
      if name == '.lock' and root == str(path):
        continue
      full = os.path.join(root, name)
      with open(full, 'rb') as f:
        out[os.path.relpath(full, path)] = f.read()
  return out


def expected_episode_items(steps, episode_length, long_episodes='split'):
  """Items a correct episode table holds: each episode's steps (see TableConfig).

  The last, unfinished episode counts too (the test ended it explicitly).

  Returns:
    A list of stacked items of 1..episode_length steps (unpadded).
  """
  episodes, episode = [], []
  for step in steps:
    if step.is_first() and episode:
      episodes.append(episode)
      episode = []
    episode.append(step)
    if step.is_boundary():
      episodes.append(episode)
      episode = []
  if episode:
    episodes.append(episode)
  pieces = []
  for episode in episodes:
    if len(episode) <= episode_length:
      pieces.append(episode)
    elif long_episodes == 'split':
      pieces += [episode[i:i + episode_length]
                 for i in range(0, len(episode), episode_length)]
    elif long_episodes == 'truncate':
      pieces.append(episode[:episode_length])
  return [tree.map_structure(lambda *xs: np.stack(xs), *piece)
          for piece in pieces]


def read_all_items(manager, table_name, batch_size=16, timeout_s=2.0):
  """Every item of `table_name`, read once with unpadded content.

  Samples a FIFO `max_times_sampled=1` table until it times out.

  Returns:
    `(items, infos)`: fingerprints of each item's unmasked steps in sampling
    order, and per item `(key, mask)`.
  """
  items, infos = [], []
  iterator = iter(manager.get_dataset(batch_size=batch_size,
                                      table_name=table_name,
                                      sample_timeout_s=timeout_s))
  while True:
    try:
      trajectory, info = next(iterator)
    except Exception:  # pylint: disable=broad-except
      return items, infos  # The timeout: the table is empty.
    mask, keys = info.mask.numpy(), info.key.numpy()
    batch = tree.map_structure(lambda t: t.numpy(), trajectory)  # Once.
    for b in range(mask.shape[0]):
      length = int(mask[b].sum())
      items.append(item_fingerprint(tree.map_structure(
          lambda t: t[b, :length], batch)))  # pylint: disable=cell-var-from-loop
      infos.append((int(keys[b, 0]), mask[b]))


def frame_spec(shape):
  """A trajectory spec whose observation is a uint8 frame stack of `shape`."""
  return trajectory_lib.Trajectory(
      step_type=tf.TensorSpec([], tf.int32, 'step_type'),
      observation=tensor_spec.BoundedTensorSpec(shape, tf.uint8, 0, 255,
                                                'observation'),
      action=tensor_spec.BoundedTensorSpec([], tf.int64, 0, 5, 'action'),
      policy_info=(),
      next_step_type=tf.TensorSpec([], tf.int32, 'step_type'),
      reward=tf.TensorSpec([], tf.float32, 'reward'),
      discount=tensor_spec.BoundedTensorSpec([], tf.float32, 0.0, 1.0,
                                             'discount'))


def frame_step(step_type, observation, action, next_step_type, reward=0.0,
               discount=1.0):
  """One step of `frame_spec`."""
  return trajectory_lib.Trajectory(
      step_type=np.int32(step_type), observation=observation,
      action=np.int64(action), policy_info=(),
      next_step_type=np.int32(next_step_type), reward=np.float32(reward),
      discount=np.float32(discount))


def frame_stream(steps, *, depth=3, seed=0, frame_shape=(6, 5)):
  """Steps of `frame_spec([depth, *frame_shape])`: stacked frames on the
  first axis, episodes of 2-14 steps; a few stacks that do not continue the
  previous one (stored whole)."""
  rng = np.random.default_rng(seed)
  made, current, stack = [], 0, None
  while len(made) < steps:
    if current == 0 or rng.random() < 0.05:  # A reset, or a jump.
      stack = rng.integers(0, 255, (depth,) + tuple(frame_shape), np.uint8)
    else:
      stack = np.concatenate([stack[1:], rng.integers(
          0, 255, (1,) + tuple(frame_shape), np.uint8)])
    following = 2 if current and rng.random() < 0.15 else 1
    if current == 2:
      following = 0
    made.append(frame_step(current, stack.copy(), rng.integers(6), following))
    current = following
  return made
