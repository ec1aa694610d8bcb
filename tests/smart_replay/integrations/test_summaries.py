"""The buffer's TensorBoard scalars, in one line of a user's Learner."""

import glob
import os

import pytest
import tensorflow as tf
from tf_agents.policies import random_py_policy
from tf_agents.train import learner
from tf_agents.train.utils import train_utils

import smart_replay
from smart_replay.integrations import summaries as telemetry
from tests import testing


def _scalars(directory):
  found = {}
  for path in glob.glob(os.path.join(str(directory), 'events.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        found.setdefault(value.tag, {})[event.step] = float(
            tf.make_ndarray(value.tensor))
  return found


@pytest.fixture
def env():
  return testing.make_env()


def test_uniform_table_scalars_match_stats(env, tmp_path):
  spec = testing.collect_data_spec(env)
  with smart_replay.ReplayBufferManager(
      spec, capacity=1000, checkpoint_dir=str(tmp_path / 'buf')) as manager:
    _, observer = manager.create_replay_buffer()
    testing.run_actor(observer, steps=60, env=env)
    observer.flush()
    batches = iter(manager.get_dataset(batch_size=8, num_steps=2))
    next(batches)
    trigger = telemetry.BufferSummaries(manager, summary_dir=str(tmp_path / 'tb'),
                                        interval=10)
    trigger(0)
    trigger(5)    # within the interval: nothing written
    trigger(10)
    stats = manager.stats()
    items = manager.num_frames()
  scalars = _scalars(tmp_path / 'tb')
  assert set(scalars['buffer/items']) == {0, 10}
  assert scalars['buffer/items'][10] == items
  table = next(iter(stats['tables'].values()))
  assert scalars['buffer/inserts'][10] == table['inserts']
  assert scalars['buffer/samples'][10] >= 8  # a batch (and its prefetch)
  assert scalars['buffer/sample_to_insert_ratio'][10] == pytest.approx(
      scalars['buffer/samples'][10] / table['inserts'])
  for tag in ('buffer/insert_blocked_s', 'buffer/sample_blocked_s',
              'buffer/insert_wait_total_s', 'buffer/env_steps',
              'buffer/episodes'):
    assert tag in scalars, sorted(scalars)
  assert scalars['buffer/env_steps'][10] == stats['env_steps']
  assert 'buffer/max_priority' not in scalars  # not prioritized


def test_prioritized_and_uniform_tables_in_the_default_writer(env, tmp_path):
  spec = testing.collect_data_spec(env)
  tables = [smart_replay.TableConfig(name='uniform'),
            smart_replay.TableConfig(name='prioritized', sampler='prioritized')]
  with smart_replay.ReplayBufferManager(
      spec, capacity=500, table_configs=tables,
      checkpoint_dir=str(tmp_path / 'buf')) as manager:
    _, observer = manager.create_replay_buffer()
    testing.run_actor(observer, steps=30, env=env)
    observer.flush()
    writer = tf.summary.create_file_writer(str(tmp_path / 'tb'))
    with writer.as_default():
      written = telemetry.write_buffer_summaries(manager, step=7)
    writer.flush()
  scalars = _scalars(tmp_path / 'tb')
  assert scalars.keys() == written.keys()
  assert scalars['buffer/prioritized/max_priority'][7] == 1.0
  assert 'buffer/uniform/max_priority' not in scalars
  assert scalars['buffer/items'][7] == scalars['buffer/uniform/items'][7]


def test_interval_is_checked(env, tmp_path):
  del env, tmp_path
  with pytest.raises(ValueError, match='interval.*0'):
    telemetry.BufferSummaries(None, summary_dir=None, interval=0)


def test_one_line_in_a_tf_agents_learner(tmp_path):
  """A Learner trigger writes into the Learner's own event file, at its own
  interval (the Learner records summaries only every summary_interval)."""
  from smart_replay.apps import agents  # pylint: disable=g-import-not-at-top
  from smart_replay.apps.envs import factory  # pylint: disable=g-import-not-at-top
  env = factory.make_environment('gym:CartPole-v1', seed=0)
  train_step = train_utils.create_train_step()
  agent = agents.make_agent('dqn', time_step_spec=env.time_step_spec(),
                            action_spec=env.action_spec(),
                            train_step=train_step)
  tables = [smart_replay.TableConfig(name='uniform'),
            smart_replay.TableConfig(name='prioritized', sampler='prioritized')]
  with smart_replay.ReplayBufferManager(
      agent.collect_data_spec, capacity=500, sequence_length=2,
      table_configs=tables, checkpoint_dir=str(tmp_path / 'buf')) as manager:
    _, observer = manager.create_replay_buffer()
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(),
                                             env.action_spec())
    testing.run_actor(observer, steps=100, env=env, policy=policy)
    trainer = learner.Learner(
        str(tmp_path / 'root'), train_step, agent,
        experience_dataset_fn=lambda: manager.get_dataset(batch_size=8,
                                                          num_steps=2),
        summary_interval=1000,
        triggers=[smart_replay.BufferSummaries(manager, interval=3)])
    for _ in range(3):
      trainer.run(iterations=2)  # Train steps 2 (written), 4, 6 (written).
    trainer.train_summary_writer.flush()
    items = manager.num_frames()
    stats = manager.stats()['tables']
  files = glob.glob(str(tmp_path / 'root' / 'train' / 'events.*'))
  assert len(files) == 1, files  # The Learner's own.
  scalars = _scalars(tmp_path / 'root' / 'train')
  assert set(scalars['buffer/items']) == {2, 6}, scalars['buffer/items']
  assert scalars['buffer/items'][6] == items
  assert scalars['buffer/uniform/items'][6] == stats['uniform']['items']
  assert scalars['buffer/prioritized/items'][6] == stats['prioritized']['items']
  assert scalars['buffer/uniform/samples'][6] >= 6 * 8  # 6 batches of 8
  assert scalars['buffer/prioritized/samples'][6] == 0  # Not sampled.
  assert scalars['buffer/prioritized/max_priority'][6] == 1.0
  for table in ('uniform', 'prioritized'):
    for name in ('inserts', 'sample_to_insert_ratio', 'insert_blocked_s',
                 'sample_blocked_s'):
      assert f'buffer/{table}/{name}' in scalars, sorted(scalars)
