"""The buffer's TensorBoard scalars, in one line of a user's Learner."""

import glob
import os

import pytest
import tensorflow as tf
from tf_agents.train import learner

import smart_replay
from smart_replay import telemetry
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
