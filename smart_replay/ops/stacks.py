"""Frame stacks gathered from decoded frames, inside the TensorFlow graph.

A thin wrapper over `SmartReplayGatherStacks` (`stack_ops.cc`, compiled into
the zstd op library, so it is there wherever zstd frames are decoded):
`gather` builds stacks of frames from their indexes in one pass, writing
them depth-last (frames interleaved byte by byte, TF-Agents' `[84, 84, 4]`)
or depth-first (`[4, 84, 84]`) as it goes, where a `tf.gather` and a
`tf.transpose` would copy the stacks twice (the transpose of uint8 is slow:
about 0.5 GB/s). `split` is its inverse for the writers, on numpy arrays,
through the library's C function (`smart_replay_split_stacks`).
"""

import math
from typing import Any

import numpy as np

from smart_replay.ops import zstd


def gather(frames: Any, index: Any, *, depth_last: bool) -> Any:
  """Stacks of frames, gathered by index.

  Args:
    frames: `uint8[n, frame_bytes]`, one frame per row.
    index: `int32[..., depth]`: each stack's frames, oldest first.
    depth_last: whether a stack's frames go on its last axis (interleaved)
      rather than its first.

  Returns:
    `uint8[..., frame_bytes, depth]` if `depth_last`, else `uint8[...,
    depth, frame_bytes]`: `frames[index[..., d]]` at depth `d`.

  Raises:
    ValueError: `depth_last` is not a bool.
    ZstdOpMissingError: the op library is not built.
    tf.errors.InvalidArgumentError: when run, an index is outside `[0,
      n)`; the message names its flat position and value.
  """
  if not isinstance(depth_last, bool):
    raise ValueError(f'depth_last must be a bool, got {depth_last!r}')
  module = zstd.require()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return module.smart_replay_gather_stacks(
      tf.convert_to_tensor(frames, tf.uint8),
      tf.convert_to_tensor(index, tf.int32), depth_last=depth_last)



def split(stacked: np.ndarray, *, frame_rank: int) -> np.ndarray:
  """Depth-last uint8 stacks cut into their frames, with numpy arrays.

  The inverse of `gather(..., depth_last=True)` for the write path: one C
  call (`smart_replay_split_stacks`) where numpy's transposing copy
  (`np.ascontiguousarray(np.moveaxis(...))`) costs about 20 us an Atari
  stack.

  Args:
    stacked: `uint8[..., *frame_shape, depth]`, the frames on the last
      axis.
    frame_rank: the rank of a frame (2 for `[84, 84]`); the dimensions
      before the frame's are batch dimensions.

  Returns:
    A new C-contiguous `uint8[..., depth, *frame_shape]`.

  Raises:
    ValueError: `stacked` is not uint8, or has no room for a frame of
      `frame_rank` and a depth.
    ZstdOpMissingError: the op library is not built.
  """
  # Cheap checks only: the writers call this once a step.
  if (stacked.dtype != np.uint8 or isinstance(frame_rank, bool) or
      not isinstance(frame_rank, int) or frame_rank < 1 or
      stacked.ndim < frame_rank + 1):
    raise ValueError(
        f'stacked must be uint8 [..., *frame_shape, depth] with frames of '
        f'rank frame_rank={frame_rank!r}; got {stacked.dtype}'
        f'{list(stacked.shape)}')
  shape = stacked.shape
  batch, frame_shape = shape[:-1 - frame_rank], shape[-1 - frame_rank:-1]
  frames = np.empty(batch + shape[-1:] + frame_shape, np.uint8)
  # The input goes as a bytes copy (about 1 us an Atari stack, C order
  # whatever its strides). Exporting arrays' buffers to ctypes instead (2 us
  # faster than `.ctypes.data`) leaves about 110 B of buffer info on each:
  # 15% more memory a stored Atari step, measured (2026-11-28).
  zstd.c_library().smart_replay_split_stacks(
      stacked.tobytes(), math.prod(batch), shape[-1],
      math.prod(frame_shape), frames.ctypes.data)
  return frames
