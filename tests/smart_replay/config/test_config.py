"""Tests for smart_replay.config.buffer (no Reverb server)."""

import json

import pytest

from smart_replay.config import buffer as config_lib
from smart_replay.config import tables
from smart_replay.manager import manager_options

pytestmark = pytest.mark.unit


def _config(data_spec, **overrides):
  kwargs = dict(data_spec=data_spec, capacity=100, sequence_length=3,
                stride_length=1, table_configs=[tables.TableConfig()])
  kwargs.update(overrides)
  return config_lib.BufferConfig.resolve(**kwargs)


def test_resolve_fills_table_fields_from_the_buffer(data_spec):
  config = _config(data_spec)
  table = config.table()
  assert (table.max_size, table.sequence_length, table.stride_length) == (
      100, 3, 1)


def test_manifest_round_trip(data_spec):
  config = _config(data_spec, table_configs=[
      tables.TableConfig(), tables.TableConfig(name='p', sampler='prioritized',
                                               max_size=7)])
  stored = json.loads(json.dumps(config.to_manifest()))
  again = config_lib.BufferConfig.from_manifest(stored)
  assert again.to_manifest() == config.to_manifest()
  assert again.tables == config.tables
  assert again.diff(config) == [] and config.diff(stored) == []
  assert again.constructor_kwargs()['table_configs'] == list(config.tables)


def test_diff_lists_every_difference_with_both_values(data_spec):
  stored = _config(data_spec).to_manifest()
  requested = _config(data_spec, capacity=50, stride_length=2)
  diffs = requested.diff(stored)
  assert ('capacity', 100, 50) in diffs
  assert ('stride_length', 1, 2) in diffs
  assert ('tables/experience/max_size', 100, 50) in diffs
  assert ('tables/experience/stride_length', 1, 2) in diffs


def test_new_buffers_are_packed_and_the_manifest_records_the_layout(
    data_spec):
  config = _config(data_spec)
  assert config.layout == 'packed'
  stored = json.loads(json.dumps(config.to_manifest()))
  assert stored['layout']['name'] == 'packed'
  assert stored['layout']['bytes_per_step'] == (
      config.step_layout.step_spec.shape[0])
  assert config_lib.BufferConfig.from_manifest(stored).layout == 'packed'
  assert _config(data_spec, layout='columns').diff(stored) == [
      ('layout', 'packed', 'columns')]


def test_configs_without_a_recorded_layout_are_columns(data_spec):
  stored = _config(data_spec, layout='columns').to_manifest()
  assert stored['layout'] == {'name': 'columns'}
  old = {k: v for k, v in stored.items() if k != 'layout'}  # Before issue 16.
  assert config_lib.BufferConfig.from_manifest(old).layout == 'columns'
  assert _config(data_spec, layout='columns').diff(old) == []
  assert _config(data_spec).diff(old) == [('layout', 'columns', 'packed')]
  assert config_lib.BufferConfig.from_manifest(old).constructor_kwargs()[
      'layout'] == 'columns'


def test_a_spec_that_cannot_pack_defaults_to_columns_and_refuses_packed():
  import tensorflow as tf
  from tf_agents.trajectories import trajectory
  spec = trajectory.Trajectory(
      step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec(
          [2], tf.string), action=tf.TensorSpec([], tf.int32),
      policy_info=(), next_step_type=tf.TensorSpec([], tf.int32),
      reward=tf.TensorSpec([], tf.float32),
      discount=tf.TensorSpec([], tf.float32))
  assert _config(spec).layout == 'columns'
  with pytest.raises(ValueError, match="field 'observation' has dtype"):
    _config(spec, layout='packed')


def test_table_lookups_name_what_there_is(data_spec):
  config = _config(data_spec, table_configs=[
      tables.TableConfig(), tables.TableConfig(name='p', sampler='prioritized')])
  assert config.table_names == ['experience', 'p']
  assert config.table('p').name == 'p'
  assert config.prioritized_table().name == 'p'
  with pytest.raises(ValueError, match=r"unknown table_name 'q'.*'p'"):
    config.table('q')
  with pytest.raises(ValueError, match="not 'prioritized'"):
    config.prioritized_table('experience')
  with pytest.raises(ValueError, match='no prioritized table'):
    _config(data_spec).prioritized_table()


def test_config_is_immutable(data_spec):
  config = _config(data_spec)
  with pytest.raises(AttributeError):
    config.capacity = 5


def test_a_checkpoint_dir_that_is_a_file_is_refused_by_the_constructor(
    data_spec, tmp_path):
  path = tmp_path / 'notes.txt'
  path.write_text('mine')
  with pytest.raises(ValueError, match=r"checkpoint_dir '.*notes.txt' is an "
                     'existing file, not a directory'):
    manager_options.group_options(data_spec, capacity=10, checkpoint_dir=str(path))
  assert path.read_text() == 'mine'


@pytest.mark.parametrize('kwargs, message', [
    ({'server_address': 'nohost', 'capacity': None, 'checkpoint_dir': None},
     "server_address must be 'host:port'"),
    ({'server_address': 'h:1', 'port': 5, 'capacity': None,
      'checkpoint_dir': None}, 'client mode'),
    ({'capacity': None}, r'capacity \(None\) and checkpoint_dir'),
    ({'capacity': 0}, 'capacity must be a positive integer, got 0'),
    ({'sample_timeout_s': -1},
     'sample_timeout_s must be a positive number, got -1'),
    ({'table_configs': [tables.TableConfig(), tables.TableConfig()]},
     'names must be unique'),
    ({'num_envs': 1.5}, 'num_envs must be a positive integer'),
    ({'non_finite': 'ignore'}, "non_finite must be one of"),
    ({'actor_id': 2}, r'actor_id=2: for client mode'),
    ({'layout': 'rows'}, r"layout must be one of \('columns', 'packed'\) or "
     "None, got 'rows'"),
])
def test_manager_argument_checks_name_the_argument(data_spec, kwargs,
                                                   message):
  args = dict(capacity=10, checkpoint_dir='/tmp/x')
  args.update(kwargs)
  with pytest.raises(ValueError, match=message):
    manager_options.group_options(data_spec, **args)
