"""The writers' one-call frame cell (`smart_replay.ops.cell_encoder`): the
same bytes as `frame_blobs.encode` of the frames `StackEncoder` picks, on
streams that continue, break and restart; read-only inputs; bad arguments
named.

Runs the real compiled library (see test_zstd.py).
"""

import numpy as np
import pytest

from smart_replay.layouts import frame_blobs
from smart_replay.layouts import frame_cells
from smart_replay.ops import cell_encoder
from smart_replay.ops import zstd


@pytest.fixture(scope='module', autouse=True)
def _built_op():
  zstd.require()


def _stream(rng, steps, depth, frame_shape):
  """Stacks of a rolling window of frames, broken now and then."""
  frames = [rng.integers(0, 4, frame_shape, np.uint8) for _ in range(depth)]
  out = []
  for step in range(steps):
    if step % 7 == 5:  # A stack that cannot continue the previous one.
      frames = [rng.integers(100, 200, frame_shape, np.uint8)
                for _ in range(depth)]
    else:
      frames = frames[1:] + [rng.integers(0, 4, frame_shape, np.uint8)]
    out.append(np.stack(frames))
  return out


@pytest.mark.parametrize('depth', [2, 4, 9])
@pytest.mark.parametrize('frame_shape', [(1,), (7, 5), (84, 84)])
@pytest.mark.parametrize('row_bytes', [0, 3, 86])
def test_cells_are_the_python_encoders_bytes(depth, frame_shape, row_bytes):
  rng = np.random.default_rng(depth * 1000 + row_bytes)
  frame_bytes = int(np.prod(frame_shape))
  cells = cell_encoder.ZstdCells(depth=depth, frame_bytes=frame_bytes,
                                 row_bytes=row_bytes,
                                 level=frame_blobs.ZSTD_LEVEL)
  reference = frame_cells.StackEncoder()
  for step, stack in enumerate(_stream(rng, 30, depth, frame_shape)):
    if step == 20:  # A new stream: the whole stack again.
      cells.reset()
      reference.reset()
    row = rng.integers(0, 256, row_bytes, np.uint8)
    got = cells.encode(row, stack)
    want = frame_blobs.encode(row[None], [reference.new_frames(stack)],
                              codec='zstd')
    assert got == want, step
    counts, rows, frames = frame_blobs.decode(
        got, row_bytes, frame_bytes, codec='zstd')
    new = 1 if step not in (0, 5, 12, 19, 20, 26) else depth
    assert counts.tolist() == [new]
    np.testing.assert_array_equal(rows[0], row)
    np.testing.assert_array_equal(
        frames, stack[-new:].reshape(new, frame_bytes))


def test_read_only_and_strided_inputs_are_read_as_they_are():
  rng = np.random.default_rng(3)
  cells = cell_encoder.ZstdCells(depth=4, frame_bytes=6, row_bytes=2,
                                 level=3)
  stack = rng.integers(0, 256, (4, 2, 3), np.uint8)
  stack.setflags(write=False)
  row = np.frombuffer(b'\x01\x02', np.uint8)  # Read-only.
  strided = np.asfortranarray(stack)
  want = frame_blobs.encode(row[None], [stack], codec='zstd')
  assert cells.encode(row, stack) == want
  cells.reset()
  assert cells.encode(row, strided) == want


def test_the_kept_frames_are_a_copy():
  # The caller may reuse its array for the next step (an environment's
  # buffer): the comparison is with the frames as they were.
  cells = cell_encoder.ZstdCells(depth=2, frame_bytes=3, row_bytes=0,
                                 level=3)
  stack = np.array([[1, 1, 1], [2, 2, 2]], np.uint8)
  cells.encode(np.zeros(0, np.uint8), stack)
  stack[:] = [[9, 9, 9], [9, 9, 9]]  # Not a continuation of [[1], [2]].
  counts, _, _ = frame_blobs.decode(
      cells.encode(np.zeros(0, np.uint8), stack), 0, 3, codec='zstd')
  assert counts.tolist() == [2]


@pytest.mark.parametrize('name, value', [
    ('depth', 0), ('depth', 256), ('depth', True), ('depth', 2.0),
    ('frame_bytes', -1), ('row_bytes', -1), ('row_bytes', None)])
def test_bad_arguments_are_named(name, value):
  arguments = dict(depth=4, frame_bytes=6, row_bytes=2, level=3)
  arguments[name] = value
  with pytest.raises(ValueError, match=f'{name} must be .*{value!r}'):
    cell_encoder.ZstdCells(**arguments)


def test_bad_levels_and_sizes_are_named():
  with pytest.raises(ValueError, match="level must be an int, got '3'"):
    cell_encoder.ZstdCells(depth=2, frame_bytes=1, row_bytes=0, level='3')
  cells = cell_encoder.ZstdCells(depth=2, frame_bytes=4, row_bytes=1,
                                 level=99)
  with pytest.raises(ValueError, match='could not compress a cell at level '
                     '99'):
    cells.encode(np.zeros(1, np.uint8), np.zeros((2, 4), np.uint8))
  cells = cell_encoder.ZstdCells(depth=2, frame_bytes=4, row_bytes=1,
                                 level=3)
  with pytest.raises(ValueError, match=r'uint8 frames of 8 bytes .* got '
                     r'uint8\[1\] and uint8\[2, 3\]'):
    cells.encode(np.zeros(1, np.uint8), np.zeros((2, 3), np.uint8))
  with pytest.raises(ValueError, match=r'got float32\[1\]'):
    cells.encode(np.zeros(1, np.float32), np.zeros((2, 4), np.uint8))
