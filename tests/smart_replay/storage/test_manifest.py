"""Tests for smart_replay.storage.manifest."""

import json

import pytest
import tensorflow as tf

from smart_replay.config import record
from smart_replay.config import tables
from smart_replay.storage import manifest

pytestmark = pytest.mark.unit


def _config(data_spec, **overrides):
  kwargs = dict(data_spec=data_spec, sequence_length=2, stride_length=1,
                capacity=100,
                table_configs=[tables.TableConfig().resolve(
                    capacity=100, sequence_length=2, stride_length=1)])
  kwargs.update(overrides)
  return record.build_config(**kwargs)


def test_identical_configs_have_no_differences(data_spec):
  assert record.diff_config(_config(data_spec), _config(data_spec)) == []


def test_differences_name_each_field_with_both_values(data_spec):
  other = data_spec._replace(discount=tf.TensorSpec((2,), tf.float32))
  diffs = record.diff_config(
      _config(data_spec),
      _config(other, stride_length=2, capacity=7,
              table_configs=[tables.TableConfig(max_size=7).resolve(
                  capacity=7, sequence_length=2, stride_length=2)]))
  assert diffs == [
      ('data_spec/discount', 'float32[] in [0.0, 1.0]', 'float32[2]'),
      ('stride_length', 1, 2),
      ('capacity', 100, 7),
      ('tables/experience/max_size', 100, 7),
      ('tables/experience/stride_length', 1, 2),
  ]
  text = record.format_differences(diffs)
  assert '  capacity: checkpoint=100, requested=7' in text.splitlines()


def test_write_read_round_trip_and_versions(tmp_path, data_spec):
  path = str(tmp_path / 'manifest.json')
  written = manifest.build_manifest(_config(data_spec), counts={'env_steps': 3},
                                    files={}, checkpoint_name='ckpt-000001',
                                    extra={'train_step': 5})
  manifest.write(path, written)
  read = manifest.read(path)
  assert read == json.loads(json.dumps(written))
  assert read['versions']['dm-reverb'] == '0.14.0'
  assert read['versions']['tensorflow'].startswith('2.15')
  assert read['extra'] == {'train_step': 5}


def test_read_rejects_foreign_files(tmp_path):
  path = tmp_path / 'manifest.json'
  path.write_text('{"format": "other"}')
  with pytest.raises(ValueError, match="format 'other'"):
    manifest.read(str(path))
  path.write_text('not json')
  with pytest.raises(ValueError, match='not valid JSON'):
    manifest.read(str(path))


def test_older_manifest_tables_are_read_with_todays_defaults(data_spec):
  # A manifest written before per-table lengths existed lacks those fields.
  stored = _config(data_spec)
  for table in stored['tables']:
    for field in ('kind', 'sequence_length', 'stride_length', 'episode_length',
                  'importance_beta'):
      table.pop(field)
  assert record.diff_config(stored, _config(data_spec)) == []


def test_sampling_only_fields_may_change_on_load(data_spec):
  prioritized = tables.TableConfig(sampler='prioritized')
  resolved = lambda c: [c.resolve(capacity=100, sequence_length=2,
                                  stride_length=1)]
  stored = _config(data_spec, table_configs=resolved(prioritized))
  requested = _config(data_spec, table_configs=resolved(
      tables.TableConfig(sampler='prioritized', importance_beta=0.9,
                         priority_epsilon=0.1, initial_priority=2.0)))
  assert record.diff_config(stored, requested) == []
