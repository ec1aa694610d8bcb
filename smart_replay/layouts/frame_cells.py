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

A *group* is the bytes of n consecutive cells, `uint16 n (little-endian) |
uint8 new_frames[n] | rows[n, row_bytes] | frames`, compressed with the
buffer's codec (`FrameStack.codec`):

* 'zstd' (the default): one zstd frame per group, inflated inside the graph
  by the compiled op (`smart_replay.ops.zstd`). Per-window items store one
  cell per blob (about 180 B for an 84x84 Pong frame); a block of packed
  items is a *container* of groups of `GROUP_CELLS` cells (`uint16 groups |
  uint32 group_ends[groups] | groups`, the last group padded with empty
  cells), so that a window inflates only the one or two groups its stacks
  lie in (about 52 B a Pong frame over 8, against 56 B for zlib over 32).
* 'zlib': buffers written before zstd (a manifest without a codec is zlib):
  a cell alone at level 1 (230 B a Pong frame), a whole block as one group
  at level 6; inflated by `tf.io.decode_compressed`.

The levels and the group size come from a sweep on real Pong and Breakout
frames (docs/pixels.md).
"""

import dataclasses
import struct
from typing import Any, List, Optional, Sequence, Tuple
import zlib

from absl import logging
import cramjam
import gin
import numpy as np
import tensorflow as tf

from smart_replay.ops import zstd
from smart_replay.spec import specs

# zlib level 1 for a cell of one step: 230 B per Pong frame (level 6: 170 B,
# but inflating is 2x slower, and sampling inflates every cell of a window).
# Level 6 for a block: 56 B per frame over 32 frames (level 1: 105 B); a
# block is there to save memory.
ZLIB_LEVEL = 1
BLOCK_ZLIB_LEVEL = 6
# zstd level 3 for a cell of one step: 180 B a Pong cell in 10 us (level 9:
# 166 B in 19 us; an item's Reverb bookkeeping, about 600 B a step, dwarfs
# the difference, and every step pays the time). Level 9 for a block's
# groups: 52 B a Pong frame over 8 (level 3: 56 B; level 19: 46 B but 360 us
# a frame); a block is there to save memory. Inflating costs the same at
# every level.
ZSTD_LEVEL = 3
BLOCK_ZSTD_LEVEL = 9
# Cells per zstd group of a block: a window of 2 steps of 4-frame stacks
# inflates 1 or 2 groups of 8 (16 over 16 cost 42 B a frame, but twice the
# inflating; 4 cost 69 B).
GROUP_CELLS = 8
CODECS = ('zstd', 'zlib')
HEADER_BYTES = 2  # Bytes of a group's cell count.
_GROUP_COUNT = struct.Struct('<H')  # A container's group count.


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
    if self.codec not in CODECS:
      raise ValueError(f'FrameStack.codec must be one of {CODECS}, got '
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
    self._codec = field.option.codec
    # Before the first cell of a stream: `lookback` empty cells (no frames,
    # a zero row), so that every item references `lookback` earlier cells
    # (Reverb reads a column's references as consecutive cells of a chunk,
    # so none can be repeated instead).
    empty = np.array(encode(np.zeros([1, row_bytes], np.uint8),
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
    new = self._stacks.new_frames(step[1])
    cell = [np.array(encode(step[0][None], [new], codec=self._codec),
                     object)]
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
    return np.array(encode_block(rows[:, :self.row_bytes], frames, count,
                                 codec=self.field.option.codec), object)


def _raw(rows: np.ndarray, frames: Sequence[np.ndarray]) -> bytes:
  """A group's bytes before compression."""
  counts = len(frames).to_bytes(HEADER_BYTES, 'little') + bytes(
      len(f) for f in frames)
  parts = [counts, np.ascontiguousarray(rows).tobytes()]
  parts += [np.ascontiguousarray(f).tobytes() for f in frames]
  return b''.join(parts)


def _zstd(raws: Sequence[bytes], level: int) -> List[bytes]:
  """zstd frames (content size and checksum recorded) of `raws`, by the op
  library that inflates them."""
  return [zstd.compress(raw, level=level) for raw in raws]


def encode(rows: np.ndarray, frames: Sequence[np.ndarray], *,
           codec: str) -> bytes:
  """One cell (or group of consecutive cells), compressed.

  Args:
    rows: `uint8[n, row_bytes]`, the cells' packed rows.
    frames: per cell, its new frames `[k, *frame]` (k = 0, 1 or the depth).
    codec: 'zstd' (one frame at `ZSTD_LEVEL`, with its content size and a
      checksum) or 'zlib' (`ZLIB_LEVEL`).

  Returns:
    The compressed group.

  Raises:
    ZstdOpMissingError: if the codec is zstd and the op is not built.
  """
  raw = _raw(rows, frames)
  if codec == 'zstd':
    return _zstd([raw], ZSTD_LEVEL)[0]
  return zlib.compress(raw, ZLIB_LEVEL)


def _inflate(blob: bytes, codec: str) -> bytes:
  """A group's bytes; ValueError if it does not inflate."""
  try:
    if codec == 'zstd':
      return bytes(cramjam.zstd.decompress(blob))
    return zlib.decompress(blob)
  except (zlib.error, cramjam.DecompressionError) as e:
    raise ValueError(f'a {codec} frame blob of {len(blob)} bytes does not '
                     f'inflate: {e}') from e


def _parse(raw: bytes, row_bytes: int, frame_bytes: int
           ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`(counts, rows, frames)` of a group's inflated bytes."""
  cells = int.from_bytes(raw[:HEADER_BYTES], 'little')
  counts = np.frombuffer(raw, np.uint8, cells, HEADER_BYTES)
  start = HEADER_BYTES + cells * (1 + row_bytes)
  total = int(counts.sum(dtype=np.int64))
  if len(raw) < start or len(raw) != start + total * frame_bytes:
    raise ValueError(f'a frame blob of {len(raw)} bytes does not hold {cells} '
                     f'cells of {row_bytes}-byte rows and {total} frames of '
                     f'{frame_bytes} bytes.')
  rows = np.frombuffer(raw, np.uint8, cells * row_bytes,
                       HEADER_BYTES + cells).reshape(cells, row_bytes)
  frames = np.frombuffer(raw, np.uint8, total * frame_bytes, start).reshape(
      total, frame_bytes)
  return counts, rows, frames


def decode(blob: bytes, row_bytes: int, frame_bytes: int, *, codec: str,
           block: bool = False
           ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A blob's cells, with numpy (readers; the dataset decodes in-graph).

  Args:
    blob: what `encode` (or, with `block`, `encode_block`) made.
    row_bytes: bytes of a packed row.
    frame_bytes: bytes of one frame.
    codec: the buffer's codec, 'zstd' or 'zlib'.
    block: whether the blob is a block's (a zstd container of groups).

  Returns:
    `(counts uint8[n], rows uint8[n, row_bytes], frames uint8[total,
    frame_bytes])`; a block's unused cells count 0 frames.

  Raises:
    ValueError: if the blob is not such a blob (names the sizes).
  """
  if not (block and codec == 'zstd'):
    return _parse(_inflate(blob, codec), row_bytes, frame_bytes)
  groups = _groups(blob)
  parts = [_parse(_inflate(g, codec), row_bytes, frame_bytes) for g in groups]
  counts, rows, frames = (np.concatenate(p) for p in zip(*parts))
  return counts, rows, frames


def container_header_bytes(groups: int) -> int:
  """Bytes before the first group of a block's container of `groups`."""
  return _GROUP_COUNT.size + 4 * groups


def _groups(blob: bytes) -> List[bytes]:
  """The compressed groups of a block's container."""
  if len(blob) < _GROUP_COUNT.size:
    raise ValueError(f'a block of {len(blob)} bytes has no group count.')
  (count,) = _GROUP_COUNT.unpack_from(blob)
  head = container_header_bytes(count)
  if len(blob) < head:
    raise ValueError(f'a block of {len(blob)} bytes is shorter than its '
                     f'header of {count} groups ({head} bytes).')
  ends = np.frombuffer(blob, '<u4', count, _GROUP_COUNT.size).astype(np.int64)
  starts = np.concatenate([[0], ends[:-1]])
  if count == 0 or np.any(ends < starts) or head + ends[-1] != len(blob):
    raise ValueError(f'a block of {len(blob)} bytes does not hold the '
                     f'{count} groups its header lists (ending at '
                     f'{ends.tolist()} after {head} bytes).')
  return [blob[head + a:head + b] for a, b in zip(starts, ends)]


def block_groups(block_length: int) -> int:
  """zstd groups of a block of `block_length` cells."""
  return -(-block_length // GROUP_CELLS)


def empty_group(row_bytes: int) -> bytes:
  """A zstd group of `GROUP_CELLS` cells without frames and with zero rows
  (what a window that needs fewer groups inflates in place of the rest)."""
  return encode(np.zeros([GROUP_CELLS, row_bytes], np.uint8),
                [np.zeros([0], np.uint8)] * GROUP_CELLS, codec='zstd')


def encode_block(rows: np.ndarray, frames: np.ndarray, count: int, *,
                 codec: str) -> bytes:
  """One blob of a block of consecutive steps of one stream.

  Args:
    rows: `uint8[block_length, row_bytes]`, the steps' packed rows.
    frames: `[block_length, depth, *frame]`, their stacks' frames.
    count: the steps the block holds (the rest are unused).
    codec: 'zstd' (a container of groups of `GROUP_CELLS` cells) or 'zlib'
      (one group).

  Returns:
    The blob of `block_length` cells (zstd: padded to whole groups): the
    first a whole stack, then each step's new frames; unused cells hold
    none.

  Raises:
    ZstdOpMissingError: if the codec is zstd and the op is not built.
  """
  encoder = StackEncoder()
  news = [encoder.new_frames(f) for f in frames[:count]]
  if codec == 'zlib':
    return zlib.compress(_raw(rows, news + [frames[0][:0]] * (
        len(rows) - count)), BLOCK_ZLIB_LEVEL)
  cells = block_groups(len(rows)) * GROUP_CELLS
  padded = np.zeros([cells, rows.shape[1]], np.uint8)
  padded[:len(rows)] = rows
  news += [frames[0][:0]] * (cells - count)
  groups = _zstd([_raw(padded[g:g + GROUP_CELLS], news[g:g + GROUP_CELLS])
                  for g in range(0, cells, GROUP_CELLS)], BLOCK_ZSTD_LEVEL)
  ends = np.cumsum([len(g) for g in groups]).astype('<u4')
  return b''.join([_GROUP_COUNT.pack(len(groups)), ends.tobytes()] + groups)


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
    def stacked(depth, others):
      return 2 <= depth <= 16 and min(others) >= 8 and depth < min(others)
    last = stacked(shape[-1], shape[:-1]) and shape[-1] != 3
    first = stacked(shape[0], shape[1:])
    if last != first:
      found = FrameStack(leaf.path, axis=-1 if last else 0)
      logging.info(
          'frame_stack: field %r of shape %s looks like a stack of %d frames '
          'on axis %d; each frame is stored once (pass frame_stack=False to '
          'store whole stacks, or a FrameStack to name another field).',
          leaf.path, shape, shape[-1] if last else shape[0], found.axis)
      return found
  return None
