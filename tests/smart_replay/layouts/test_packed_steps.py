"""Tests for smart_replay.layouts.packed_steps: one byte row per step, and back."""

import numpy as np
import pytest
import tensorflow as tf
import tree

from smart_replay.layouts import packed_steps

pytestmark = pytest.mark.unit

SPEC = {
    'observation': {'temperature': tf.TensorSpec([3], tf.float32),
                    'occupied': tf.TensorSpec([], tf.bool),
                    'image': tf.TensorSpec([2, 2, 1], tf.uint8)},
    'action': tf.TensorSpec([2], tf.float64),
    'step_type': tf.TensorSpec([], tf.int32),
    'count': tf.TensorSpec([], tf.int64),
    'delta': tf.TensorSpec([4], tf.int8),
    'half': tf.TensorSpec([1], tf.float16),
}


def _step(rng, batch=()):
  def make(spec):
    shape = tuple(batch) + tuple(spec.shape.as_list())
    dtype = spec.dtype.as_numpy_dtype
    if spec.dtype == tf.bool:
      return rng.integers(0, 2, shape).astype(bool)
    if spec.dtype.is_integer:
      info = np.iinfo(dtype)
      return rng.integers(info.min, info.max, shape, dtype=dtype,
                          endpoint=True)
    return rng.standard_normal(shape).astype(dtype)
  return tree.map_structure(make, SPEC)


def _assert_same(got, want):
  for g, w in zip(tree.flatten(got), tree.flatten(want)):
    g = np.asarray(g)
    assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_array_equal(g, w)


def test_layout_is_every_field_in_flatten_order():
  codec = packed_steps.StepCodec(SPEC)
  layout = codec.describe()
  paths = [f['path'] for f in layout['fields']]
  assert paths == ['action', 'count', 'delta', 'half', 'observation/image',
                   'observation/occupied', 'observation/temperature',
                   'step_type']
  sizes = [f['nbytes'] for f in layout['fields']]
  assert sizes == [16, 8, 4, 2, 4, 1, 12, 4]
  assert codec.bytes_per_step == sum(sizes) == 51
  offsets = [f['offset'] for f in layout['fields']]
  assert offsets == [0, 16, 24, 28, 30, 34, 35, 47]


def test_pack_then_unpack_and_decode_give_the_step_back():
  codec = packed_steps.StepCodec(SPEC)
  step = _step(np.random.default_rng(0))
  row = codec.pack(tree.flatten(step))
  assert row.dtype == np.uint8 and row.shape == (51,)
  _assert_same(codec.unpack(row), step)
  _assert_same(tree.map_structure(lambda t: t.numpy(),
                                  codec.decode(tf.constant(row))), step)


def test_batches_pack_one_row_per_step_and_decode_keeps_static_shapes():
  codec = packed_steps.StepCodec(SPEC)
  steps = _step(np.random.default_rng(1), batch=(5, 2))  # [batch, time]
  rows = codec.pack(tree.flatten(steps))
  assert rows.shape == (5, 2, 51)
  one = codec.pack(tree.flatten(tree.map_structure(lambda a: a[3, 1], steps)))
  np.testing.assert_array_equal(rows[3, 1], one)

  dataset = tf.data.Dataset.from_tensors(rows).map(codec.decode)
  assert dataset.element_spec['observation']['image'].shape == [5, 2, 2, 2, 1]
  assert dataset.element_spec['count'].dtype == tf.int64
  _assert_same(tree.map_structure(lambda t: t.numpy(), next(iter(dataset))),
               steps)


def test_decode_with_an_unknown_batch_dimension():
  codec = packed_steps.StepCodec(SPEC)
  steps = _step(np.random.default_rng(2), batch=(3,))
  rows = codec.pack(tree.flatten(steps))
  decode = tf.function(codec.decode, input_signature=[
      tf.TensorSpec([None, codec.bytes_per_step], tf.uint8)])
  _assert_same(tree.map_structure(lambda t: t.numpy(), decode(rows)), steps)


def test_extreme_values_survive():
  spec = {'f': tf.TensorSpec([4], tf.float32), 'i': tf.TensorSpec([2], tf.int64)}
  codec = packed_steps.StepCodec(spec)
  step = {'f': np.array([np.nan, np.inf, -0.0, 1e-45], np.float32),
          'i': np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max])}
  got = codec.unpack(codec.pack(tree.flatten(step)))
  assert np.array_equal(got['f'].view(np.uint32), step['f'].view(np.uint32))
  np.testing.assert_array_equal(got['i'], step['i'])


@pytest.mark.parametrize('spec, message', [
    ({'name': tf.TensorSpec([], tf.string)}, "field 'name' has dtype string"),
    ({'obs': tf.TensorSpec([None, 3], tf.float32)},
     "field 'obs' has shape \\[None, 3\\]"),
])
def test_unpackable_specs_are_refused_by_field(spec, message):
  with pytest.raises(ValueError, match=message):
    packed_steps.StepCodec(spec)


def test_pack_refuses_a_field_of_the_wrong_type():
  codec = packed_steps.StepCodec(SPEC)
  flat = tree.flatten(_step(np.random.default_rng(3)))
  flat[0] = flat[0].astype(np.float32)  # 'action' is float64.
  with pytest.raises(ValueError, match="field 'action' is float32\\[2\\]"):
    codec.pack(flat)
  with pytest.raises(ValueError, match='7 fields, the spec has 8'):
    codec.pack(flat[1:])
