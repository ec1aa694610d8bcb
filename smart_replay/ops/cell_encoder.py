"""One stream's zstd frame cells, one C call a step (`cell_encoder.cc`).

A per-window writer of a frame-stacked layout appends a cell a step: the
step's packed row and the frames new in its stack (the newest one when the
stack continues the previous step's, else all of them), compressed as one
zstd frame (`smart_replay.layouts.frame_blobs` gives the format; its
`encode` makes the same bytes in Python). `ZstdCells.encode` does the
comparison, the group's bytes and the compression in one call of the op
library (`smart_replay_encode_cell`), keeping the previous step's frames in
a buffer of its own.
"""

import ctypes

import numpy as np

from smart_replay.ops import zstd


class ZstdCells:
  """One stream's cells: each step's new frames and row, compressed.

  Args:
    depth: frames per stack (1..255).
    frame_bytes: bytes of a frame.
    row_bytes: bytes of a packed row.
    level: the zstd level.

  Raises:
    ValueError: on a bad argument; the message names it and its value.
    ZstdOpMissingError: the op library is not built.
  """

  def __init__(self, *, depth: int, frame_bytes: int, row_bytes: int,
               level: int):
    for name, value, low, high in (('depth', depth, 1, 255),
                                   ('frame_bytes', frame_bytes, 0, None),
                                   ('row_bytes', row_bytes, 0, None)):
      if (isinstance(value, bool) or not isinstance(value, int) or
          value < low or (high is not None and value > high)):
        raise ValueError(f'{name} must be an int in [{low}, '
                         f'{high or "inf"}], got {value!r}')
    zstd.check_level(level)
    self._library = zstd.c_library()
    self._depth, self._frame_bytes = depth, frame_bytes
    self._row_bytes, self._level = row_bytes, level
    self._stack_bytes = depth * frame_bytes
    # The previous step's frames (`encode` compares and replaces them).
    self._previous = np.zeros(max(self._stack_bytes, 1), np.uint8)
    self._previous_address = self._previous.ctypes.data
    self._has_previous = 0
    self._capacity = self._library.smart_replay_zstd_compress_bound(
        3 + row_bytes + self._stack_bytes)
    self._out = ctypes.create_string_buffer(self._capacity)

  def encode(self, row: np.ndarray, frames: np.ndarray) -> bytes:
    """The step's cell: its row and new frames, one zstd frame.

    Args:
      row: `uint8[row_bytes]`, the step's packed row.
      frames: the step's stack cut into frames, oldest first:
        `uint8[depth, *frame_shape]`.

    Returns:
      The compressed cell (`frame_blobs.encode(row[None], [new frames],
      codec='zstd')` gives the same bytes).

    Raises:
      ValueError: `row` or `frames` is not uint8 of the sizes above.
    """
    # Cheap checks only: called once a step.
    if (row.dtype != np.uint8 or row.size != self._row_bytes or
        frames.dtype != np.uint8 or frames.size != self._stack_bytes):
      raise ValueError(
          f'expected a uint8 row of {self._row_bytes} bytes and uint8 frames '
          f'of {self._stack_bytes} bytes ({self._depth} frames); got '
          f'{row.dtype}{list(row.shape)} and {frames.dtype}'
          f'{list(frames.shape)}')
    # The inputs go as bytes copies (about 1 us an Atari stack; see
    # `stacks.split`).
    size = self._library.smart_replay_encode_cell(
        frames.tobytes(), self._previous_address, self._has_previous,
        self._depth, self._frame_bytes, row.tobytes(), self._row_bytes,
        self._level, self._out, self._capacity)
    if size < 0:
      raise ValueError(f'zstd could not compress a cell at level '
                       f'{self._level!r}.')
    self._has_previous = 1
    return ctypes.string_at(self._out, size)

  def reset(self) -> None:
    """The next step starts a stream: its cell holds the whole stack."""
    self._has_previous = 0
