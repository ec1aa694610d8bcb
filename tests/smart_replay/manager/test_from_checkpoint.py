"""ReplayBufferManager.from_checkpoint takes what decides reading from the
manifest: a caller's frame_stack is refused like its layout."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory as trajectory_lib

import smart_replay
from smart_replay import FrameStack

_DEPTH, _HEIGHT, _WIDTH = 3, 4, 5


def _spec():
  """A tiny pixel step: a stack of 3 frames of 4x5 on the first axis."""
  return trajectory_lib.Trajectory(
      step_type=tf.TensorSpec([], tf.int32, 'step_type'),
      observation=tensor_spec.BoundedTensorSpec(
          [_DEPTH, _HEIGHT, _WIDTH], tf.uint8, 0, 255, 'observation'),
      action=tensor_spec.BoundedTensorSpec([], tf.int64, 0, 3, 'action'),
      policy_info=(),
      next_step_type=tf.TensorSpec([], tf.int32, 'step_type'),
      reward=tf.TensorSpec([], tf.float32, 'reward'),
      discount=tensor_spec.BoundedTensorSpec([], tf.float32, 0.0, 1.0,
                                             'discount'))


def _episode(steps, seed=0):
  """One episode of `steps` steps whose stacks slide one frame a step, as a
  frame-stacking wrapper makes them, then its boundary step."""
  rng = np.random.default_rng(seed)
  stack = rng.integers(0, 255, (_DEPTH, _HEIGHT, _WIDTH), np.uint8)
  made = []
  for t in range(steps + 1):
    step_type = 0 if t == 0 else 2 if t == steps else 1
    next_type = 0 if t == steps else 2 if t == steps - 1 else 1
    made.append(trajectory_lib.Trajectory(
        step_type=np.int32(step_type), observation=stack.copy(),
        action=np.int64(t % 4), policy_info=(),
        next_step_type=np.int32(next_type), reward=np.float32(t),
        discount=np.float32(1.0)))
    stack = np.concatenate(
        [stack[1:], rng.integers(0, 255, (1, _HEIGHT, _WIDTH), np.uint8)])
  return made


def _checkpointed(buffer_dir, frame_stack):
  """A buffer of one 8-step episode, checkpointed; returns its stacks."""
  stream = _episode(8)
  with smart_replay.ReplayBufferManager(
      _spec(), capacity=100, checkpoint_dir=str(buffer_dir),
      sequence_length=2, frame_stack=frame_stack) as manager:
    _, observer = manager.create_replay_buffer()
    for step in stream:
      observer(step)
    observer.flush()
    manager.checkpoint()
  return {step.observation.tobytes() for step in stream}


@pytest.mark.parametrize('stored', [FrameStack('observation', 0), None],
                         ids=['frame_stack', 'plain'])
@pytest.mark.parametrize('asked', [FrameStack('observation', 0),
                                   FrameStack('observation', -1), None],
                         ids=['same', 'other_axis', 'none'])
def test_a_frame_stack_argument_is_refused(tmp_path, stored, asked):
  _checkpointed(tmp_path / 'b', stored)
  with pytest.raises(ValueError, match=r"reads \['frame_stack'\] from the "
                     "checkpoint's manifest"):
    smart_replay.ReplayBufferManager.from_checkpoint(str(tmp_path / 'b'),
                                                     frame_stack=asked)


@pytest.mark.parametrize('stored', [FrameStack('observation', 0), None],
                         ids=['frame_stack', 'plain'])
def test_the_manifests_frame_stack_reads_the_items(tmp_path, stored):
  stacks = _checkpointed(tmp_path / 'b', stored)
  manager = smart_replay.ReplayBufferManager.from_checkpoint(
      str(tmp_path / 'b'))
  with manager:
    # None recorded: False, so that none is looked for in the spec either.
    assert manager.options.shape.frame_stack == (stored or False)
    manager.load_replay_buffer()
    read = [trajectory.observation
            for trajectory, _ in manager.epoch(batch_size=4, seed=0)]
  observations = np.concatenate(read)
  # Windows of 2 steps inside the 8-step episode, each step a whole stack
  # that was written.
  assert observations.shape == (8, 2, _DEPTH, _HEIGHT, _WIDTH)
  assert {o.tobytes() for o in observations.reshape(
      -1, _DEPTH, _HEIGHT, _WIDTH)} <= stacks
