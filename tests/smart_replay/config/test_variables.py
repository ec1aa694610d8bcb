"""The policy variables table (`smart_replay.config.variables`): the signature
TF-Agents' example server builds, the Reverb table its container accepts,
the manifest entry and its differences, bad fields named."""

import pytest
import tensorflow as tf

from smart_replay.config import variables

pytestmark = pytest.mark.unit


def _policy_variables():
  return [tf.Variable(tf.zeros([3, 2])), tf.Variable(tf.zeros([2])),
          tf.Variable(tf.zeros([], tf.float64))]


def test_the_signature_is_the_example_servers():
  signature = variables.signature_of(_policy_variables())
  assert signature == {
      'policy_variables': [tf.TensorSpec([3, 2], tf.float32),
                           tf.TensorSpec([2], tf.float32),
                           tf.TensorSpec([], tf.float64)],
      'train_step': tf.TensorSpec([], tf.int64)}
  # Specs do as well as variables.
  assert variables.signature_of(signature['policy_variables']) == signature


def test_the_reverb_table_is_what_the_container_accepts():
  table = variables.VariablesTable(
      variables.signature_of(_policy_variables()))
  info = table.reverb_table().info
  assert (table.name, table.num_leaves) == ('variables', 4)
  assert info.max_size == 1 and info.max_times_sampled == 0
  assert info.rate_limiter_info.min_size_to_sample == 1
  assert 'uniform' in str(info.sampler_options).lower()
  assert 'fifo' in str(info.remover_options).lower()
  assert info.signature is not None


def test_the_manifest_entry_round_trips_and_names_differences():
  table = variables.VariablesTable(
      variables.signature_of(_policy_variables()), name='weights')
  stored = table.to_manifest()
  assert variables.VariablesTable.from_manifest(stored) == table
  assert table.differences(stored) == []
  wider = variables.VariablesTable(variables.signature_of(
      [tf.Variable(tf.zeros([3, 4]))] + _policy_variables()[1:]))
  assert wider.differences(stored) == [
      ('variables/name', "'weights'", "'variables'"),
      ('variables/signature/policy_variables/0', 'float32[3, 2]',
       'float32[3, 4]')]


@pytest.mark.parametrize('fields, message', [
    (dict(signature={'policy_variables': []}, name='variables'),
     "must be a dict of 'policy_variables' and 'train_step'"),
    (dict(signature={'policy_variables': [],
                     'train_step': tf.TensorSpec([], tf.int32)}),
     r"\['train_step'\] must be tf.TensorSpec\(\[\], tf.int64\)"),
    (dict(signature={'policy_variables': [tf.TensorSpec([None])],
                     'train_step': tf.TensorSpec([], tf.int64)}),
     r"\['policy_variables'\] must be a list of tf.TensorSpec of known"),
    (dict(signature=variables.signature_of([]), name=''),
     "name must be a non-empty string, got ''"),
])
def test_bad_fields_are_named(fields, message):
  with pytest.raises(ValueError, match=message):
    variables.VariablesTable(**fields)


def test_unknown_shapes_and_bad_manifests_are_named():
  with pytest.raises(ValueError, match=r'policy_variables\[0\] .* has shape '
                     r'\(None, 2\)'):
    variables.signature_of([tf.TensorSpec([None, 2])])
  with pytest.raises(ValueError, match="must hold 'name' and 'signature'"):
    variables.VariablesTable.from_manifest({'name': 'variables'})
