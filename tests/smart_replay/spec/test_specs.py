"""Tests for smart_replay.spec.specs."""

import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec

from smart_replay.spec import specs

pytestmark = pytest.mark.unit


def test_table_signature_adds_time_dim_and_keeps_nesting(data_spec):
  signature = specs.table_signature(data_spec, 3)
  flat = dict((l.path, l) for l in specs.flatten_spec(signature))
  assert flat['observation/temperature'].shape == (3, 3)
  assert flat['observation/occupancy'].shape == (3,)
  assert flat['policy_info/log_probability'].dtype == 'float32'
  assert flat['action'].shape == (3, 1)
  # Bounded specs become plain TensorSpecs: Reverb signatures hold dtype/shape.
  assert all(type(s) is tf.TensorSpec for s in tf.nest.flatten(signature))
  assert type(signature).__name__ == 'Trajectory'


@pytest.mark.parametrize('bad', [0, -1, 1.5, '2'])
def test_table_signature_rejects_bad_sequence_length(data_spec, bad):
  with pytest.raises(ValueError, match='sequence_length'):
    specs.table_signature(data_spec, bad)


def test_validate_data_spec_names_the_bad_leaf():
  with pytest.raises(ValueError, match=r"'obs/x' is a int"):
    specs.validate_data_spec({'obs': {'x': 3}})
  with pytest.raises(ValueError, match='empty'):
    specs.validate_data_spec(())


def test_spec_json_round_trip(data_spec):
  stored = specs.spec_to_json(data_spec)
  restored = specs.spec_from_json(stored)
  assert restored == data_spec
  assert type(restored) is type(data_spec)  # tf_agents' own Trajectory.
  action = [l for l in stored['leaves'] if l['path'] == 'action'][0]
  assert action['minimum'] == -1.0 and action['maximum'] == 1.0


def test_diff_spec_leaves_lists_each_differing_field(data_spec):
  other = data_spec._replace(
      observation={**data_spec.observation,
                   'temperature': tf.TensorSpec((4,), tf.float64)},
      action=tensor_spec.BoundedTensorSpec((1,), tf.float32, -2.0, 2.0))
  diffs = specs.diff_spec_leaves(specs.spec_to_json(data_spec)['leaves'],
                                 specs.spec_to_json(other)['leaves'])
  assert ('data_spec/observation/temperature', 'float32[3] in [-10.0, 40.0]',
          'float64[4]') in diffs
  assert ('data_spec/action', 'float32[1] in [-1.0, 1.0]',
          'float32[1] in [-2.0, 2.0]') in diffs
  assert len(diffs) == 2
