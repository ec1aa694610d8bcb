"""Stacked pixel observations: each frame stored once, compressed.

A frame-stacking wrapper repeats every frame in D consecutive observations:
TF-Agents' `FrameStack4` / `suite_atari` stack on the last axis (`[84, 84,
4]`), Gymnasium's `FrameStackObservation` on the first (`[4, 84, 84]`). With
`FrameStack(field, axis)` the packed layout stores each step as one *cell*:
the step's packed row without the stacked field, and only the frames that are
new in it: the newest frame when its stack continues the previous step's
(`obs_t[:-1] == obs_{t-1}[1:]` along the stack axis, compared byte for byte),
the whole stack otherwise (an episode start, with whatever padding the
wrapper used at the reset, or any stack that does not continue).
`detect_frame_stack` finds such a field in a spec by its shape.

Rebuilding is exact: the stack of a cell is the last D frames of the frames of
the cells up to and including it. An item therefore references the D - 1
cells before its first step too; a stream of cells starts with D - 1 empty
cells (no frames, a zero row: Reverb reads a column's references as
consecutive cells, so a reference cannot be repeated instead), then a whole
stack. A block of packed items starts with a whole stack.

Cells are stored compressed, one per Reverb step or a block of them in one
(`frame_blobs`, with the buffer's codec: zstd, or zlib for buffers written
before it).
"""

import dataclasses
from typing import Any, List, Optional, Sequence

from absl import logging
import gin
import numpy as np
import tensorflow as tf

from smart_replay.layouts import frame_blobs
from smart_replay.ops import cell_encoder
from smart_replay.ops import stacks
from smart_replay.spec import specs


@gin.configurable
@dataclasses.dataclass(frozen=True)
class FrameStack:
  """Which field of a step is a stack of frames, and along which axis.

  Attributes:
    field: the field's path in the data spec, e.g. 'observation' or
      'observation/pixels'.
    axis: the stack axis: -1 (or rank - 1) for `[84, 84, 4]` (TF-Agents'
      `FrameStack4`), 0 for `[4, 84, 84]` (Gymnasium's
      `FrameStackObservation`).
  """
  field: str = 'observation'
  axis: int = -1
  codec: str = 'zstd'

  def __post_init__(self):
    if self.codec not in frame_blobs.CODECS:
      raise ValueError(f'FrameStack.codec must be one of '
                       f'{frame_blobs.CODECS}, got '
                       f'{self.codec!r}.')

  def describe(self) -> dict:
    """The option as a manifest records it.

    Returns:
      `{'field': ..., 'axis': ..., 'codec': ...}`.
    """
    return {'field': self.field, 'axis': self.axis, 'codec': self.codec}


class StackedField:
  """The stacked field of a spec: where it is and what one frame is.

  Args:
    frame_stack: the `FrameStack` option.
    data_spec: the spec of one step.

  Raises:
    ValueError: if the field is not in the spec, its dtype is not numeric,
      its shape is not fully known, the axis is not its first or last, or
      it stacks fewer than 2 frames; the message names the value.
  """

  def __init__(self, frame_stack: FrameStack, data_spec: Any):
    if not isinstance(frame_stack, FrameStack):
      raise ValueError(f'frame_stack must be a smart_replay.FrameStack or '
                       f'None, got {frame_stack!r}.')
    leaves = specs.flatten_spec(data_spec)
    paths = [leaf.path for leaf in leaves]
    if frame_stack.field not in paths:
      raise ValueError(
          f'FrameStack.field={frame_stack.field!r} is not a field of the '
          f'data spec; its fields are {paths}.')
    self.index = paths.index(frame_stack.field)
    leaf = leaves[self.index]
    shape = list(leaf.shape)
    dtype = np.dtype(tf.as_dtype(leaf.dtype).as_numpy_dtype)
    if dtype != np.uint8 or any(d is None for d in shape):
      raise ValueError(
          f'FrameStack.field={frame_stack.field!r} is {leaf.dtype}{shape}; '
          'a frame stack needs a uint8 field (pixels) of fully known shape.')
    rank = len(shape)
    if rank < 2 or frame_stack.axis not in (0, -1, rank - 1):
      raise ValueError(
          f'FrameStack.axis={frame_stack.axis!r} for field '
          f'{frame_stack.field!r} of shape {shape}: the stack axis must be '
          f'the first (0) or the last (-1) of a field of rank >= 2.')
    self.last_axis = frame_stack.axis != 0
    self.depth = shape[-1] if self.last_axis else shape[0]
    if self.depth < 2:
      raise ValueError(
          f'FrameStack: field {frame_stack.field!r} of shape {shape} stacks '
          f'{self.depth} frame(s) on axis {frame_stack.axis}; a stack holds '
          'at least 2.')
    self.shape = tuple(shape)
    self.dtype = dtype
    self.frame_shape = tuple(shape[:-1] if self.last_axis else shape[1:])
    self.frame_bytes = int(np.prod(self.frame_shape)) * dtype.itemsize
    self.option = frame_stack

  @property
  def lookback(self) -> int:
    """Cells an item references before its first step: depth - 1."""
    return self.depth - 1

  def frames(self, stack: np.ndarray) -> np.ndarray:
    """The frames of stacks, oldest first.

    Args:
      stack: `[..., *field shape]` (leading batch dimensions allowed).

    Returns:
      `[..., depth, *frame_shape]`; for a last-axis stack, a contiguous
      copy (comparing, compressing and journaling a strided view of
      interleaved frames cost about 20 times as much), cut by the op
      library's C function with zstd (`stacks.split`, about 7 us an Atari
      stack), by numpy with zlib (about 20 us; no compiled library needed).
    """
    if not self.last_axis:
      return stack
    if self.option.codec == 'zstd':
      return stacks.split(stack, frame_rank=len(self.frame_shape))
    return np.ascontiguousarray(np.moveaxis(
        stack, -1, -1 - len(self.frame_shape)))

  def stacks(self, frames: np.ndarray) -> np.ndarray:
    """The inverse of `frames`.

    Args:
      frames: `[..., depth, *frame_shape]`.

    Returns:
      `[..., *field shape]`.
    """
    return np.moveaxis(frames, -1 - len(self.frame_shape), -1) if (
        self.last_axis) else frames


class StackEncoder:
  """One stream's cells: what is new in each step's stack."""

  def __init__(self):
    # The bytes of the previous step's newest depth - 1 frames.
    self._tail = None

  def new_frames(self, frames: np.ndarray) -> np.ndarray:
    """The frames of this step a cell must hold (the stream's next step).

    Args:
      frames: the step's stack as `StackedField.frames` gives it.

    Returns:
      The newest frame `[1, *frame]` if the stack continues the previous
      step's, else the whole stack.
    """
    # bytes == bytes is one memcmp: 1.8 us an Atari stack, with both copies.
    # (memoryview's == compares multi-dimensional views item by item: 106 us
    # when the stacks are equal; np.array_equal 9.5 us.)
    previous, self._tail = self._tail, frames[1:].tobytes()
    if previous is not None and frames[:-1].tobytes() == previous:
      return frames[-1:]
    return frames

  def reset(self) -> None:
    """The next step starts with a whole stack (e.g. the cells before it are
    forgotten)."""
    self._tail = None


class CellEncoder:
  """What one stream's writer appends for each step: its cells.

  Args:
    field: the spec's `StackedField`.
    row_bytes: bytes of a packed row.
  """

  def __init__(self, field: StackedField, row_bytes: int):
    self._codec = field.option.codec
    if self._codec == 'zstd':  # Comparison, bytes and zstd in one C call.
      self._stacks = cell_encoder.ZstdCells(
          depth=field.depth, frame_bytes=field.frame_bytes,
          row_bytes=row_bytes, level=frame_blobs.ZSTD_LEVEL)
      self._encode = self._stacks.encode
    else:
      self._stacks = StackEncoder()
      self._encode = self._encode_zlib
    # Before the first cell of a stream: `lookback` empty cells (no frames,
    # a zero row), so that every item references `lookback` earlier cells
    # (Reverb reads a column's references as consecutive cells of a chunk,
    # so none can be repeated instead).
    empty = np.array(frame_blobs.encode(np.zeros([1, row_bytes], np.uint8),
                            [np.zeros((0,) + field.frame_shape, np.uint8)],
                            codec=self._codec), object)
    self._before = [[empty]] * field.lookback

  def cells(self, step: Sequence[np.ndarray], *, first: bool
            ) -> List[List[np.ndarray]]:
    """The Reverb steps (one blob each) to append for a step.

    Args:
      step: the layout's columns of the step: `[row, frames]`.
      first: whether it is the first step of a stream of cells (after
        `reset()`): the empty cells come first.

    Returns:
      `[[blob], ...]`: the empty cells if `first`, then the step's cell.
    """
    cell = [np.array(self._encode(step[0], step[1]), object)]
    return self._before + [cell] if first else [cell]

  def _encode_zlib(self, row: np.ndarray, frames: np.ndarray) -> bytes:
    """A step's cell in zlib (`ZstdCells.encode` for zstd)."""
    return frame_blobs.encode(row[None], [self._stacks.new_frames(frames)],
                              codec=self._codec)

  def reset(self) -> None:
    """The next step starts a stream: a whole stack after empty cells."""
    self._stacks.reset()


class Cells:
  """How a frame-stacked layout's writers make cells.

  Attributes:
    field: the spec's `StackedField`.
    row_bytes: bytes of a packed row (the other fields).
    lookback: cells an item references before its first step.
    stack_bytes: bytes of a whole stack.

  Args:
    field: the spec's `StackedField`.
    row_bytes: bytes of a packed row.
  """

  def __init__(self, field: StackedField, row_bytes: int):
    self.field = field
    self.row_bytes = row_bytes
    self.lookback = field.lookback
    self.stack_bytes = field.depth * field.frame_bytes

  def encoder(self) -> CellEncoder:
    """A new stream's cells.

    Returns:
      A `CellEncoder` of this field and row size.
    """
    return CellEncoder(self.field, self.row_bytes)

  def block(self, rows: np.ndarray, count: int) -> np.ndarray:
    """One block's blob (an object scalar for Reverb).

    Args:
      rows: `uint8[block_length, row_bytes + stack_bytes]`: each step's
        packed row, then its stack's frames.
      count: the steps the block holds.

    Returns:
      The blob of `encode_block`.
    """
    frames = rows[:, self.row_bytes:].reshape(
        (len(rows), self.field.depth, self.field.frame_bytes))
    return np.array(encode_block(rows[:, :self.row_bytes], frames, count,
                                 codec=self.field.option.codec), object)


def encode_block(rows: np.ndarray, frames: np.ndarray, count: int, *,
                 codec: str) -> bytes:
  """One blob of a block of consecutive steps of one stream.

  Args:
    rows: `uint8[block_length, row_bytes]`, the steps' packed rows.
    frames: `[block_length, depth, *frame]`, their stacks' frames.
    count: the steps the block holds (the rest are unused).
    codec: 'zstd' or 'zlib' (see `frame_blobs.encode_block`).

  Returns:
    The blob of `block_length` cells: the first a whole stack, then each
    step's new frames; unused cells hold none.

  Raises:
    ZstdOpMissingError: if the codec is zstd and the op is not built.
  """
  encoder = StackEncoder()
  news = [encoder.new_frames(f) for f in frames[:count]]
  return frame_blobs.encode_block(rows, news, codec=codec)


def _holds_frames(depth: int, others: Sequence[int]) -> bool:
  """Whether an axis of `depth` beside dimensions `others` looks like a
  stack of frames: 2 to 16 of them, each at least 8 by 8 and larger than
  the stack."""
  return 2 <= depth <= 16 and min(others) >= 8 and depth < min(others)


def detect_frame_stack(data_spec: Any) -> Optional[FrameStack]:
  """The stacked pixel field of a spec, found by its shape, or None.

  A field is taken for a stack of frames if it is uint8 of rank >= 3 with a
  fully known shape, and exactly one of its first and last axes holds 2 to
  16 frames, fewer than each of its other dimensions, which are at least 8:
  `[84, 84, 4]` (axis -1) and `[4, 84, 84]` (axis 0). A last axis of 3 is
  taken for RGB, not a stack. The first such field is chosen. A wrong guess
  costs speed, never data: a step whose stack does not continue the last
  one's is stored whole.

  Args:
    data_spec: the spec of one step.

  Returns:
    A `FrameStack(field, axis)` with the default codec, or None.
  """
  for leaf in specs.flatten_spec(data_spec):
    shape = list(leaf.shape)
    if (len(shape) < 3 or any(d is None for d in shape) or
        tf.as_dtype(leaf.dtype) != tf.uint8):
      continue
    last = _holds_frames(shape[-1], shape[:-1]) and shape[-1] != 3
    first = _holds_frames(shape[0], shape[1:])
    if last != first:
      found = FrameStack(leaf.path, axis=-1 if last else 0)
      logging.info(
          'frame_stack: field %r of shape %s looks like a stack of %d frames '
          'on axis %d; each frame is stored once (pass frame_stack=False to '
          'store whole stacks, or a FrameStack to name another field).',
          leaf.path, shape, shape[-1] if last else shape[0], found.axis)
      return found
  return None
