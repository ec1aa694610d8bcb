"""Frame blobs: cells compressed, a block's container of zstd groups."""

import numpy as np
import pytest

from smart_replay.layouts import frame_blobs


@pytest.mark.unit
@pytest.mark.parametrize('codec', ['zstd', 'zlib'])
def test_a_cell_round_trips(codec):
  rng = np.random.default_rng(1)
  rows = rng.integers(0, 255, (1, 7), np.uint8)
  frames = rng.integers(0, 255, (3, 6, 5), np.uint8)
  counts, got_rows, got = frame_blobs.decode(
      frame_blobs.encode(rows, [frames], codec=codec), 7, 30, codec=codec)
  assert counts.tolist() == [3]
  np.testing.assert_array_equal(got_rows, rows)
  np.testing.assert_array_equal(got, frames.reshape(3, 30))


@pytest.mark.unit
def test_zstd_blocks_are_groups_of_8_cells_padded():
  assert frame_blobs.block_groups(8) == 1
  assert frame_blobs.block_groups(21) == 3
  assert frame_blobs.block_groups(64) == 8
  rows = np.zeros((21, 7), np.uint8)
  news = [np.full((3, 30), 1, np.uint8)] + [np.full((1, 30), k, np.uint8)
                                            for k in range(2, 12)]
  blob = frame_blobs.encode_block(rows, news, codec='zstd')
  assert int.from_bytes(blob[:2], 'little') == 3
  counts, _, frames = frame_blobs.decode(blob, 7, 30, codec='zstd', block=True)
  assert counts.tolist() == [3] + [1] * 10 + [0] * 13  # 24 cells: 3 groups.
  assert frames[:, 0].tolist() == [1, 1, 1] + list(range(2, 12))


@pytest.mark.unit
def test_damaged_zstd_blocks_are_refused_by_the_reader():
  rng = np.random.default_rng(0)
  frames = rng.integers(0, 255, (20, 3, 6, 5), np.uint8)
  rows = rng.integers(0, 255, (20, 7), np.uint8)
  blob = frame_blobs.encode_block(
      rows, [frames[0]] + [f[-1:] for f in frames[1:]], codec='zstd')
  counts, got_rows, got = frame_blobs.decode(blob, 7, 30, codec='zstd',
                                             block=True)
  assert len(counts) == 24 and counts[0] == 3 and counts[20:].sum() == 0
  np.testing.assert_array_equal(got_rows[:20], rows)
  np.testing.assert_array_equal(got[:3], frames[0].reshape(3, 30))
  for bad in (blob[:1], blob[:10], blob[:-1], blob + b'x',
              blob[:40] + bytes([blob[40] ^ 1]) + blob[41:]):
    with pytest.raises(ValueError):
      frame_blobs.decode(bad, 7, 30, codec='zstd', block=True)
