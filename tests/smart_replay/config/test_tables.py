"""Tests for smart_replay.config.tables."""

import math

import gin
import numpy as np
import pytest
import reverb
import tensorflow as tf

from smart_replay.config import limiter
from smart_replay.config import reverb_tables
from smart_replay.config import tables

DATA_SPEC = {'x': tf.TensorSpec([3], tf.float32)}


def _resolved(**kwargs):
  return tables.TableConfig(**kwargs).resolve(capacity=100, sequence_length=2,
                                              stride_length=1)


@pytest.mark.parametrize('kwargs, message', [
    ({'sampler': 'random'}, r"sampler is 'random'; expected one of"),
    ({'remover': 'prioritized'}, 'remover'),
    ({'kind': 'trajectory'}, "kind is 'trajectory'"),
    ({'max_size': 0}, 'max_size is 0'),
    ({'max_times_sampled': -1}, 'max_times_sampled is -1'),
    ({'min_size_to_sample': 0}, 'min_size_to_sample is 0'),
    ({'min_size_to_sample': 11, 'max_size': 10},
     'min_size_to_sample is 11; expected <= max_size=10'),
    ({'samples_per_insert': 0.0, 'error_buffer': 1.0},
     r'samples_per_insert is 0.0; expected a number > 0'),
    ({'samples_per_insert': -2.0, 'error_buffer': 1.0}, 'samples_per_insert'),
    ({'samples_per_insert': 2.0}, 'error_buffer is None'),
    ({'samples_per_insert': 4.0, 'error_buffer': 2.0},
     r'error_buffer is 2.0; expected a number >= max\(1, samples_per_insert\) '
     '= 4'),
    ({'error_buffer': 3.0}, 'error_buffer is 3.0; expected None unless'),
    ({'samples_per_insert': 2.0, 'error_buffer': 4.0, 'max_times_sampled': 1},
     'samples_per_insert is 2.0; expected <= max_times_sampled=1'),
    ({'block_inserts_when_full': True}, 'needs max_times_sampled=1'),
    ({'priority_exponent': -0.5},
     r'priority_exponent is -0.5; expected a number >= 0 \(alpha'),
    ({'importance_beta': 1.5}, 'importance_beta is 1.5'),
    ({'importance_beta_final': 1.0}, 'annealing beta needs both'),
    ({'initial_priority': -1.0}, 'initial_priority is -1.0'),
    ({'initial_priority': 0.0}, 'initial_priority is 0.0; expected a number > 0'),
    ({'priority_epsilon': 0.0}, 'priority_epsilon is 0.0; expected a number > 0'),
    ({'sampler': 'fifo', 'max_times_sampled': 1, 'block_inserts_when_full': True,
      'min_size_to_sample': 5}, 'min_size_to_sample=1 \\(got 5'),
    ({'kind': 'episode'}, 'episode_length is None; expected an integer >= 1'),
    ({'kind': 'episode', 'episode_length': 0},
     'episode_length is 0; expected an integer >= 1'),
    ({'kind': 'episode', 'episode_length': 5, 'sequence_length': 2},
     'sequence_length is 2; expected None for an episode table'),
    ({'kind': 'episode', 'episode_length': 5, 'long_episodes': 'keep'},
     "long_episodes is 'keep'"),
    ({'episode_length': 5}, "episode_length is 5; expected None for a sequence"),
    ({'sequence_length': 0}, 'sequence_length is 0'),
    ({'name': ''}, 'name'),
])
@pytest.mark.unit
def test_bad_config_names_field_and_value(kwargs, message):
  with pytest.raises(ValueError, match=message):
    tables.TableConfig(**kwargs)


@pytest.mark.unit
def test_resolve_fills_only_what_is_unset():
  config = tables.TableConfig(max_size=5, sequence_length=4)
  resolved = config.resolve(capacity=10, sequence_length=2, stride_length=3)
  assert (resolved.max_size, resolved.sequence_length,
          resolved.stride_length) == (5, 4, 3)
  episode = tables.TableConfig(kind='episode', episode_length=7).resolve(
      capacity=10, sequence_length=2, stride_length=3)
  assert (episode.sequence_length, episode.item_length) == (None, 7)
  with pytest.raises(ValueError, match='not resolved'):
    reverb_tables.make_table(tables.TableConfig(), DATA_SPEC)


def test_make_table_follows_config():
  config = _resolved(sampler='prioritized', priority_exponent=0.6,
                     max_times_sampled=5, samples_per_insert=4.0,
                     error_buffer=10.0, min_size_to_sample=5, max_size=77)
  info = reverb_tables.make_table(config, DATA_SPEC).info
  assert info.max_size == 77
  assert info.max_times_sampled == 5
  assert info.sampler_options.prioritized.priority_exponent == pytest.approx(0.6)
  assert info.remover_options.fifo
  assert info.rate_limiter_info.samples_per_insert == 4.0
  assert info.rate_limiter_info.min_size_to_sample == 5
  assert info.signature['x'].shape.as_list() == [2, 3]


def test_queue_and_episode_tables():
  queue = reverb_tables.make_table(_resolved(sampler='fifo', max_times_sampled=1,
                                      block_inserts_when_full=True,
                                      max_size=9), DATA_SPEC).info
  assert queue.rate_limiter_info.max_diff == 9  # Reverb's Queue(9).
  assert queue.rate_limiter_info.min_diff == 0
  episode = reverb_tables.make_table(_resolved(kind='episode', episode_length=6),
                              DATA_SPEC).info
  assert episode.signature['x'].shape.as_list() == [None, 3]


def test_running_table_differences_sees_a_restored_config():
  requested = reverb_tables.make_table(_resolved(max_size=10), DATA_SPEC)
  other = reverb_tables.make_table(_resolved(max_size=50, sampler='lifo'),
                            {'x': tf.TensorSpec([4], tf.float32)})
  fields = {d[0] for d in reverb_tables.running_table_differences(requested,
                                                           other.info)}
  assert fields == {'tables/experience/max_size', 'tables/experience/sampler',
                    'tables/experience/signature'}
  assert not reverb_tables.running_table_differences(requested, requested.info)


@pytest.mark.unit
def test_diff_table_configs_by_name_ignores_sampling_only_fields():
  a = [tables.TableConfig(max_size=5).to_dict()]
  b = [tables.TableConfig(max_size=6, importance_beta=1.0).to_dict(),
       tables.TableConfig(name='other', max_size=6).to_dict()]
  assert tables.diff_table_configs(a, b) == [
      ('tables/experience/max_size', 5, 6), ('tables/other', '<missing>',
                                             'present')]


def test_table_config_is_gin_configurable():
  with gin.unlock_config():
    gin.parse_config("TableConfig.sampler = 'lifo'")
  try:
    assert tables.TableConfig().sampler == 'lifo'
  finally:
    gin.clear_config()


@pytest.mark.parametrize('kwargs', [
    dict(samples_per_insert=1.0, error_buffer=3.0, min_size_to_sample=5),
    dict(samples_per_insert=4.0, error_buffer=10.0, min_size_to_sample=3),
    dict(samples_per_insert=0.5, error_buffer=2.0, min_size_to_sample=2),
    dict(sampler='fifo', max_times_sampled=1, block_inserts_when_full=True,
         max_size=6),
])
def test_inserts_before_blocking_matches_reverb(kwargs):
  """Inserts into a real table with nothing sampling until Reverb blocks."""
  config = _resolved(**kwargs)
  server = reverb.Server([reverb_tables.make_table(config, DATA_SPEC)])
  try:
    client = server.localhost_client()
    predicted = config.inserts_before_blocking()
    writer = client.trajectory_writer(num_keep_alive_refs=2)
    writer.append({'x': np.zeros(3, np.float32)})
    inserted = 0
    with pytest.raises(reverb.errors.DeadlineExceededError):
      for _ in range(100):
        writer.append({'x': np.zeros(3, np.float32)})
        writer.create_item(config.name, 1.0, {'x': writer.history['x'][-2:]})
        writer.flush(timeout_ms=300)
        inserted += 1
    assert inserted == predicted
    state = limiter.limiter_state(config, client.server_info()[config.name])
    assert state['can_insert'] is False
    assert state['inserts_before_blocking'] == 0
  finally:
    server.stop()


@pytest.mark.unit
def test_min_size_limiter_never_blocks_inserts():
  assert tables.TableConfig().inserts_before_blocking(inserts=10**9) == \
      math.inf
