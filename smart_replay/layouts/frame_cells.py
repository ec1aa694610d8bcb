"""Stacked pixel observations: each frame stored once, compressed with zlib.

A frame-stacking wrapper repeats every frame in D consecutive observations:
TF-Agents' `FrameStack4` / `suite_atari` stack on the last axis (`[84, 84,
4]`), Gymnasium's `FrameStackObservation` on the first (`[4, 84, 84]`). With
`FrameStack(field, axis)` the packed layout stores each step as one *cell*:
the step's packed row without the stacked field, and only the frames that are
new in it: the newest frame when its stack continues the previous step's
(`obs_t[:-1] == obs_{t-1}[1:]` along the stack axis, compared byte for byte),
the whole stack otherwise (an episode start, with whatever padding the
wrapper used at the reset, or any stack that does not continue).

Rebuilding is exact: the stack of a cell is the last D frames of the frames of
the cells up to and including it. An item therefore references the D - 1
cells before its first step too; a stream of cells starts with D - 1 empty
cells (no frames, a zero row: Reverb reads a column's references as
consecutive cells, so a reference cannot be repeated instead), then a whole
stack. A block of packed items starts with a whole stack.

A *blob* is the zlib-compressed bytes of n consecutive cells: `uint16 n
(little-endian) | uint8 new_frames[n] | rows[n, row_bytes] | frames`.
Per-window items store one cell per blob (one Reverb string per step: about
230 B for an 84x84 Pong frame); a block of packed items stores all its cells
in one blob, so zlib sees across its frames (about 56 B a frame over a block
of 32, at level 6). zlib because TensorFlow inflates it inside the graph
(`tf.io.decode_compressed`): zstd compresses Pong frames better (170 B
alone, 45 B over 32) but needs Python in the sampling pipeline, and a
`tf.numpy_function` in a live `tf.data` iterator hung the interpreter at
exit (measured, see README).
"""

import dataclasses
from typing import Any, List, Sequence, Tuple
import zlib

import gin
import numpy as np
import tensorflow as tf

from smart_replay.spec import specs

# zlib level 1 for a cell of one step: 230 B per Pong frame (level 6: 170 B,
# but inflating is 2x slower, and sampling inflates every cell of a window).
# Level 6 for a block: 56 B per frame over 32 frames (level 1: 105 B); a
# block is there to save memory.
ZLIB_LEVEL = 1
BLOCK_ZLIB_LEVEL = 6
HEADER_BYTES = 2  # Bytes of a blob's cell count.


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

  def describe(self) -> dict:
    """The option as a manifest records it.

    Returns:
      `{'field': ..., 'axis': ...}`.
    """
    return {'field': self.field, 'axis': self.axis}


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
      `[..., depth, *frame_shape]`.
    """
    return np.moveaxis(stack, -1, -1 - len(self.frame_shape)) if (
        self.last_axis) else stack

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
    self._previous = None  # The previous step's frames.

  def new_frames(self, frames: np.ndarray) -> np.ndarray:
    """The frames of this step a cell must hold (the stream's next step).

    Args:
      frames: the step's stack as `StackedField.frames` gives it.

    Returns:
      The newest frame `[1, *frame]` if the stack continues the previous
      step's, else the whole stack.
    """
    previous, self._previous = self._previous, frames
    if previous is not None and np.array_equal(frames[:-1], previous[1:]):
      return frames[-1:]
    return frames

  def reset(self) -> None:
    """The next step starts with a whole stack (e.g. the cells before it are
    forgotten)."""
    self._previous = None


class CellEncoder:
  """What one stream's writer appends for each step: its cells.

  Args:
    field: the spec's `StackedField`.
    row_bytes: bytes of a packed row.
  """

  def __init__(self, field: StackedField, row_bytes: int):
    self._stacks = StackEncoder()
    # Before the first cell of a stream: `lookback` empty cells (no frames,
    # a zero row), so that every item references `lookback` earlier cells
    # (Reverb reads a column's references as consecutive cells of a chunk,
    # so none can be repeated instead).
    empty = np.array(encode(np.zeros([1, row_bytes], np.uint8),
                            [np.zeros((0,) + field.frame_shape, np.uint8)]),
                     object)
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
    new = self._stacks.new_frames(step[1])
    cell = [np.array(encode(step[0][None], [new]), object)]
    return self._before + [cell] if first else [cell]

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
    return np.array(encode_block(rows[:, :self.row_bytes], frames, count),
                    object)


def encode(rows: np.ndarray, frames: Sequence[np.ndarray],
           level: int = ZLIB_LEVEL) -> bytes:
  """One blob of consecutive cells.

  Args:
    rows: `uint8[n, row_bytes]`, the cells' packed rows.
    frames: per cell, its new frames `[k, *frame]` (k = 1 or the depth).
    level: the zlib level.

  Returns:
    The zlib-compressed blob.
  """
  counts = len(frames).to_bytes(HEADER_BYTES, 'little') + bytes(
      len(f) for f in frames)
  parts = [counts, np.ascontiguousarray(rows).tobytes()]
  parts += [np.ascontiguousarray(f).tobytes() for f in frames]
  return zlib.compress(b''.join(parts), level)


def decode(blob: bytes, row_bytes: int, frame_bytes: int
           ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A blob's cells, with numpy (readers; the dataset decodes in-graph).

  Args:
    blob: what `encode` made.
    row_bytes: bytes of a packed row.
    frame_bytes: bytes of one frame.

  Returns:
    `(counts uint8[n], rows uint8[n, row_bytes], frames uint8[total,
    frame_bytes])`; a block's unused cells count 0 frames.

  Raises:
    ValueError: if the blob is not such a blob (names the sizes).
  """
  try:
    raw = zlib.decompress(blob)
  except zlib.error as e:
    raise ValueError(f'a frame blob of {len(blob)} bytes does not inflate: '
                     f'{e}') from e
  cells = int.from_bytes(raw[:HEADER_BYTES], 'little')
  counts = np.frombuffer(raw, np.uint8, cells, HEADER_BYTES)
  start = HEADER_BYTES + cells * (1 + row_bytes)
  total = int(counts.sum(dtype=np.int64))
  if len(raw) != start + total * frame_bytes:
    raise ValueError(f'a frame blob of {len(raw)} bytes does not hold {cells} '
                     f'cells of {row_bytes}-byte rows and {total} frames of '
                     f'{frame_bytes} bytes.')
  rows = np.frombuffer(raw, np.uint8, cells * row_bytes,
                       HEADER_BYTES + cells).reshape(cells, row_bytes)
  frames = np.frombuffer(raw, np.uint8, total * frame_bytes, start).reshape(
      total, frame_bytes)
  return counts, rows, frames


def encode_block(rows: np.ndarray, frames: np.ndarray, count: int) -> bytes:
  """One blob of a block of consecutive steps of one stream.

  Args:
    rows: `uint8[block_length, row_bytes]`, the steps' packed rows.
    frames: `[block_length, depth, *frame]`, their stacks' frames.
    count: the steps the block holds (the rest are unused).

  Returns:
    The blob of `block_length` cells: the first a whole stack, then each
    step's new frames; unused cells hold none.
  """
  encoder = StackEncoder()
  news = [encoder.new_frames(f) for f in frames[:count]]
  return encode(rows, news + [frames[0][:0]] * (len(rows) - count),
                BLOCK_ZLIB_LEVEL)
