"""The frame-stack gather op (`smart_replay.ops.stacks`): exact stacks on
both axes, every depth, inside tf.data, bad indexes named.

Runs the real compiled op (in the zstd op library; see test_zstd.py).
"""

import numpy as np
import pytest
import tensorflow as tf

from smart_replay.ops import stacks
from smart_replay.ops import zstd


@pytest.fixture(scope='module', autouse=True)
def _built_op():
  zstd.require()


def _expected(frames, index, depth_last):
  gathered = frames[index]  # [..., depth, frame_bytes]
  return np.moveaxis(gathered, -2, -1) if depth_last else gathered


# Frame sizes around the 16-byte vector width (tails of every length), an
# Atari frame, depths with and without a vector path.
@pytest.mark.parametrize('frame_bytes', [1, 15, 16, 17, 33, 7056])
@pytest.mark.parametrize('depth', [2, 3, 4, 8, 70])
@pytest.mark.parametrize('depth_last', [True, False])
def test_stacks_are_the_indexed_frames(frame_bytes, depth, depth_last):
  rng = np.random.default_rng(frame_bytes * 100 + depth)
  frames = rng.integers(0, 256, (50, frame_bytes), np.uint8)
  index = rng.integers(0, 50, (3, 5, depth)).astype(np.int32)
  got = stacks.gather(frames, index, depth_last=depth_last).numpy()
  np.testing.assert_array_equal(got, _expected(frames, index, depth_last))


def test_shapes_are_inferred_and_empty_batches_work():
  frames = tf.zeros([4, 6], tf.uint8)

  @tf.function(input_signature=[tf.TensorSpec([None, 2, 4], tf.int32)])
  def gather(index):
    last = stacks.gather(frames, index, depth_last=True)
    first = stacks.gather(frames, index, depth_last=False)
    assert last.shape.as_list() == [None, 2, 6, 4], last.shape
    assert first.shape.as_list() == [None, 2, 4, 6], first.shape
    return last

  assert gather(tf.zeros([0, 2, 4], tf.int32)).shape == (0, 2, 6, 4)
  assert gather(tf.ones([3, 2, 4], tf.int32)).shape == (3, 2, 6, 4)


def test_it_runs_in_parallel_tf_data_maps():
  rng = np.random.default_rng(1)
  frames = rng.integers(0, 256, (64, 7056), np.uint8)
  indexes = rng.integers(0, 64, (40, 32, 4)).astype(np.int32)
  dataset = tf.data.Dataset.from_tensor_slices(indexes).map(
      lambda i: stacks.gather(frames, i, depth_last=True),
      num_parallel_calls=4, deterministic=True)
  for got, index in zip(dataset.as_numpy_iterator(), indexes):
    np.testing.assert_array_equal(got, _expected(frames, index, True))


@pytest.mark.parametrize('bad', [-1, 10, 2**31 - 1])
def test_an_index_outside_the_frames_is_named(bad):
  index = np.zeros([2, 4], np.int32)
  index[1, 2] = bad
  with pytest.raises(tf.errors.InvalidArgumentError, match=(
      rf'index\[6\] \(flat\) is {bad}, outside the 10 frames \[0, 10\)')):
    stacks.gather(tf.zeros([10, 8], tf.uint8), index, depth_last=True)


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match="depth_last must be a bool, got 'yes'"):
    stacks.gather(tf.zeros([1, 1], tf.uint8), [[0]], depth_last='yes')
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                     match=r'frames must be \[n, frame_bytes\]'):
    stacks.gather(tf.zeros([3], tf.uint8), [[0]], depth_last=True)


@pytest.mark.parametrize('shape', [(84, 84, 4), (3, 84, 84, 4), (5, 7, 4),
                                   (2, 33, 2), (9, 3), (4, 6, 8)])
def test_split_cuts_depth_last_stacks_into_their_frames(shape):
  rng = np.random.default_rng(len(shape))
  stacked = rng.integers(0, 256, shape, np.uint8)
  frame_rank = 1 if len(shape) == 2 else 2
  frames = stacks.split(stacked, frame_rank=frame_rank)
  expected = np.moveaxis(stacked, -1, -1 - frame_rank)
  assert frames.flags.c_contiguous
  np.testing.assert_array_equal(frames, expected)
  # A strided view is split as well; gather is its inverse.
  np.testing.assert_array_equal(
      stacks.split(stacked[..., ::-1], frame_rank=frame_rank),
      expected[..., ::-1, :, :] if frame_rank == 2 else expected[::-1])
  if len(shape) == 3 and frame_rank == 2:
    flat = frames.reshape(shape[-1], -1)
    back = stacks.gather(flat, np.arange(shape[-1], dtype=np.int32)[None],
                         depth_last=True).numpy()
    np.testing.assert_array_equal(back.reshape(shape), stacked)


@pytest.mark.parametrize('stacked, frame_rank', [
    (np.zeros([4, 4], np.float32), 1), (np.zeros([4], np.uint8), 1),
    (np.zeros([4, 4, 4], np.uint8), 0), (np.zeros([4, 4, 4], np.uint8), 3)])
def test_split_names_what_it_cannot_split(stacked, frame_rank):
  with pytest.raises(ValueError, match=(
      rf'stacked must be uint8 \[\.\.\., \*frame_shape, depth\] with frames '
      rf'of rank frame_rank={frame_rank}; got {stacked.dtype}')):
    stacks.split(stacked, frame_rank=frame_rank)
