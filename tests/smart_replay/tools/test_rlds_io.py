"""Real RLDS/TFDS: our export opens with TFDS and RLDS tools; any RLDS imports."""

import linecache
import logging
import os

import numpy as np
import pytest

import tree

import smart_replay
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import reader as checkpoint_reader
from tests import testing

rlds = pytest.importorskip('rlds')
tfds = pytest.importorskip('tensorflow_datasets')
from rlds.tfds import episode_writer  # pylint: disable=g-import-not-at-top,g-bad-import-order
from tensorflow_datasets.rlds import rlds_base  # pylint: disable=g-import-not-at-top,g-bad-import-order

from smart_replay.tools import rlds_io  # pylint: disable=g-import-not-at-top,g-bad-import-order


def _buffer(tmp_path, data_spec, steps=100):
  with smart_replay.ReplayBufferManager(
      data_spec, capacity=500, checkpoint_dir=str(tmp_path / 'b')) as manager:
    _, observer = manager.create_replay_buffer()
    testing.run_actor(observer, steps)
    path = manager.checkpoint()
  # What the buffer stores: the steps of its items.
  pieces = checkpoint_reader.CheckpointReader(path).pieces('experience')
  rewards = [tree.unflatten_as(data_spec, p.columns).reward for p in pieces]
  return str(tmp_path / 'b'), float(np.sum(np.concatenate(rewards)))


def test_our_export_opens_with_tfds_and_rlds_transformations(tmp_path,
                                                             data_spec):
  buffer_dir, stored = _buffer(tmp_path, data_spec)
  result = rlds_io.write_rlds(buffer_dir, str(tmp_path / 'rlds'))
  episodes = tfds.builder_from_directory(str(tmp_path / 'rlds')).as_dataset(
      split='train')
  steps = episodes.flat_map(lambda episode: episode[rlds.STEPS])
  assert set(steps.element_spec) >= {
      'observation', 'action', 'reward', 'discount', 'is_first', 'is_last',
      'is_terminal', 'policy_info'}
  assert len(list(episodes)) == result.episodes
  total_reward = rlds.transformations.sum_nested_steps(
      episodes, lambda step: step['reward'])
  assert float(total_reward) == pytest.approx(stored, rel=1e-5)
  lengths = [int(rlds.transformations.episode_length(e[rlds.STEPS]))
             for e in episodes]
  assert sum(lengths) == result.steps


def _foreign_dataset(path):
  """An RLDS dataset written with rlds' own EpisodeWriter, not by us: a
  pole that falls (terminal) or is cut at 6 steps (truncated)."""
  path.mkdir()
  config = rlds_base.DatasetConfig(
      name='cartpole_like',
      observation_info=tfds.features.Tensor(shape=(4,), dtype=np.float32),
      action_info=tfds.features.Tensor(shape=(), dtype=np.int64),
      reward_info=np.float32, discount_info=np.float32)
  writer = episode_writer.EpisodeWriter(data_directory=str(path),
                                        ds_config=config)
  rng = np.random.default_rng(0)
  for episode in range(10):
    length, terminal = (4, True) if episode % 2 else (6, False)
    writer.add_episode({'steps': [
        {'observation': rng.normal(size=4).astype(np.float32),
         'action': np.int64(t % 2), 'reward': np.float32(1.0),
         'discount': np.float32(1.0), 'is_first': t == 0,
         'is_last': t == length - 1,
         'is_terminal': terminal and t == length - 1}
        for t in range(length)]})
  writer.close()
  return 5 * 4 + 5 * 6


def test_an_rlds_dataset_written_elsewhere_becomes_a_starter_buffer(tmp_path):
  total = _foreign_dataset(tmp_path / 'rlds')
  path = rlds_io.import_rlds(str(tmp_path / 'rlds'), str(tmp_path / 'buffer'))
  assert path.endswith('ckpt-000001')
  with smart_replay.ReplayBufferManager.from_checkpoint(
      str(tmp_path / 'buffer')) as manager:
    manager.load_replay_buffer()
    # Windows of 2 steps inside each of the 10 episodes.
    assert manager.num_frames() == total - 10
    assert manager.loaded_manifest['extra']['imported_steps'] == total
    batches = [t for t, _ in manager.epoch(batch_size=64)]
  next_type = np.concatenate([b.next_step_type[:, 0] for b in batches])
  discount = np.concatenate([b.discount[:, 0] for b in batches])
  # Into a terminal last step: discount 0 (5 falls); a truncation keeps 1.
  assert sorted(discount[next_type == 2].tolist()) == [0.0] * 5 + [1.0] * 5


def test_counting_the_steps_converts_no_function_from_its_source(
    tmp_path, monkeypatch, caplog):
  """Autograph reads a function's source file to convert it, and warns (then
  runs it as-is) when that file no longer matches the loaded module, e.g.
  edited since import. The import's counting functions are never converted,
  so an unreadable source changes nothing."""
  total = _foreign_dataset(tmp_path / 'rlds')
  source_file = rlds_io.__file__
  getlines = linecache.getlines
  monkeypatch.setattr(linecache, 'getlines', lambda f, *a: (
      [] if f == source_file else getlines(f, *a)))
  with caplog.at_level(logging.WARNING, logger='tensorflow'):
    path = rlds_io.import_rlds(str(tmp_path / 'rlds'),
                               str(tmp_path / 'buffer'))
  assert [r.getMessage() for r in caplog.records
          if 'AutoGraph' in r.getMessage()] == []
  manifest = manifest_lib.read(os.path.join(path, manifest_lib.MANIFEST_NAME))
  assert manifest['extra']['imported_steps'] == total


def test_a_directory_that_is_not_rlds_is_named(tmp_path):
  with pytest.raises(ValueError, match='is not a TFDS dataset directory'):
    rlds_io.import_rlds(str(tmp_path), str(tmp_path / 'b'))


def test_an_rlds_cartpole_dataset_feeds_smart_replay_train(tmp_path):
  from tf_agents.policies import random_py_policy  # pylint: disable=g-import-not-at-top
  from tf_agents.specs import tensor_spec  # pylint: disable=g-import-not-at-top
  from tf_agents.trajectories import policy_step  # pylint: disable=g-import-not-at-top
  from tf_agents.trajectories import trajectory  # pylint: disable=g-import-not-at-top
  from smart_replay.apps import training  # pylint: disable=g-import-not-at-top
  from smart_replay.apps.envs import gymnasium_env  # pylint: disable=g-import-not-at-top
  env = gymnasium_env.GymnasiumEnv('CartPole-v1', seed=0)
  policy = random_py_policy.RandomPyPolicy(env.time_step_spec(),
                                           env.action_spec(), seed=0)
  (tmp_path / 'rlds').mkdir()
  writer = episode_writer.EpisodeWriter(
      data_directory=str(tmp_path / 'rlds'), ds_config=rlds_base.DatasetConfig(
          name='cartpole_random',
          observation_info=tfds.features.Tensor(shape=(4,), dtype=np.float32),
          action_info=tfds.features.Tensor(shape=(), dtype=np.int64),
          reward_info=np.float32, discount_info=np.float32))
  for _ in range(30):  # Episodes as envlogger records them.
    time_step, steps = env.reset(), []
    while not time_step.is_last():
      action = policy.action(time_step).action
      after = env.step(action)
      steps.append({'observation': time_step.observation, 'action': action,
                    'reward': after.reward, 'discount': after.discount,
                    'is_first': time_step.is_first(), 'is_last': False,
                    'is_terminal': False})
      time_step = after
    steps.append({'observation': time_step.observation,
                  'action': np.int64(0), 'reward': np.float32(0),
                  'discount': np.float32(0), 'is_first': False,
                  'is_last': True, 'is_terminal': time_step.discount == 0})
    writer.add_episode({'steps': steps})
  writer.close()
  # The agent's spec: the action bounds DQN sizes its Q-head from.
  time_step_spec = tensor_spec.from_spec(env.time_step_spec())
  data_spec = trajectory.from_transition(
      time_step_spec, policy_step.PolicyStep(tensor_spec.from_spec(
          env.action_spec())), time_step_spec)
  rlds_io.import_rlds(str(tmp_path / 'rlds'), str(tmp_path / 'starter'),
                      data_spec=data_spec)
  result = training.train_from_starter(
      starter_dir=str(tmp_path / 'starter'), run_dir=str(tmp_path / 'run'),
      env='gymnasium:CartPole-v1', num_train_steps=200,
      collect_steps_per_iteration=50, train_steps_per_iteration=100,
      eval_episodes=1)
  assert result.train_step == 200
