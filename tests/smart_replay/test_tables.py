"""Tests for smart_replay.tables."""

import pytest
import reverb
import tensorflow as tf

from smart_replay import tables

SIGNATURE = {'x': tf.TensorSpec([2, 3], tf.float32)}


@pytest.mark.parametrize('kwargs, field', [
    ({'sampler': 'random'}, 'sampler'),
    ({'remover': 'prioritized'}, 'remover'),
    ({'max_size': 0}, 'max_size'),
    ({'max_times_sampled': -1}, 'max_times_sampled'),
    ({'min_size_to_sample': 0}, 'min_size_to_sample'),
    ({'samples_per_insert': 0.0, 'error_buffer': 1.0}, 'samples_per_insert'),
    ({'samples_per_insert': 2.0}, 'error_buffer'),
    ({'priority_exponent': -0.5}, 'priority_exponent'),
    ({'name': ''}, 'name'),
])
def test_bad_config_names_field_and_value(kwargs, field):
  with pytest.raises(ValueError, match=field):
    tables.TableConfig(**kwargs)


def test_make_table_follows_config():
  config = tables.TableConfig(sampler='prioritized', priority_exponent=0.6,
                              max_times_sampled=3, samples_per_insert=4.0,
                              error_buffer=10.0, min_size_to_sample=5)
  info = tables.make_table(config.with_capacity(77), SIGNATURE).info
  assert info.max_size == 77
  assert info.max_times_sampled == 3
  assert info.sampler_options.prioritized.priority_exponent == pytest.approx(0.6)
  assert info.remover_options.fifo
  assert info.rate_limiter_info.samples_per_insert == 4.0
  assert info.rate_limiter_info.min_size_to_sample == 5


def test_with_capacity_keeps_explicit_max_size():
  assert tables.TableConfig(max_size=5).with_capacity(10).max_size == 5
  assert tables.TableConfig().with_capacity(10).max_size == 10
  with pytest.raises(ValueError, match='max_size is None'):
    tables.make_table(tables.TableConfig(), SIGNATURE)


def test_running_table_differences_sees_a_restored_config():
  requested = tables.make_table(tables.TableConfig(max_size=10), SIGNATURE)
  other = tables.make_table(
      tables.TableConfig(max_size=50, sampler='lifo'),
      {'x': tf.TensorSpec([2, 4], tf.float32)})
  fields = {d[0] for d in tables.running_table_differences(requested,
                                                           other.info)}
  assert fields == {'tables/experience/max_size', 'tables/experience/sampler',
                    'tables/experience/signature'}
  assert not tables.running_table_differences(requested, requested.info)


def test_diff_table_configs_by_name():
  a = [tables.TableConfig(max_size=5).to_dict()]
  b = [tables.TableConfig(max_size=6).to_dict(),
       tables.TableConfig(name='other', max_size=6).to_dict()]
  assert tables.diff_table_configs(a, b) == [
      ('tables/experience/max_size', 5, 6), ('tables/other', '<missing>',
                                             'present')]


def test_table_config_is_gin_configurable():
  import gin  # pylint: disable=g-import-not-at-top
  with gin.unlock_config():
    gin.parse_config("TableConfig.sampler = 'lifo'")
  try:
    assert tables.TableConfig().sampler == 'lifo'
  finally:
    gin.clear_config()
  assert isinstance(tables.make_table(tables.TableConfig(max_size=1),
                                      SIGNATURE), reverb.Table)
