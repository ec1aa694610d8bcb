"""Frame blobs: the bytes of consecutive frame cells, compressed.

A *group* is the bytes of n consecutive cells (see `frame_cells`), `uint16 n
(little-endian) | uint8 new_frames[n] | rows[n, row_bytes] | frames`,
compressed with the buffer's codec (`FrameStack.codec`):

* 'zstd' (the default): one zstd frame per group, with its content size and
  a checksum, made by the op library (`smart_replay.ops.zstd.compress`) and
  inflated inside the graph by its op (`decode_cells`). Per-window items
  store one cell per blob (about 180 B for an 84x84 Pong frame); a block of
  packed items is a *container* of groups of `GROUP_CELLS` cells (`uint16
  groups | uint32 group_ends[groups] | groups`, the last group padded with
  empty cells), so that a window inflates only the one or two groups its
  stacks lie in (about 54 B a Pong frame over 8).
* 'zlib': buffers written before zstd (a manifest without a codec is zlib):
  a cell alone at level 1 (230 B a Pong frame), a whole block as one group
  at level 6 (56 B a frame over 32); inflated by `tf.io.decode_compressed`.

The levels and the group size come from a sweep on real Pong and Breakout
frames (`benchmarks/probe_zstd_groups.py`, docs/pixels.md). `decode` reads
blobs back with numpy, for checkpoint readers.
"""

import struct
from typing import List, Sequence, Tuple
import zlib

import cramjam
import numpy as np

from smart_replay.ops import zstd

# zlib level 1 for a cell of one step: 230 B per Pong frame (level 6: 170 B,
# but inflating is 2x slower, and sampling inflates every cell of a window).
# Level 6 for a block: 56 B per frame over 32 frames (level 1: 105 B); a
# block is there to save memory.
ZLIB_LEVEL = 1
BLOCK_ZLIB_LEVEL = 6
# zstd level 3 for a cell of one step: 177 B a Pong cell in 10 us (level 9:
# 165 B in 19 us; an item's Reverb bookkeeping, about 700 B a step, dwarfs
# the difference, and every step pays the time). Level 9 for a block's
# groups: 54 B a Pong frame over 8, 60 B a Breakout one (level 3: 58 and 64;
# level 19: 48 and 55, but about 360 us a frame to encode); a block is there
# to save memory. Inflating costs the same at every level.
ZSTD_LEVEL = 3
BLOCK_ZSTD_LEVEL = 9
# Cells per zstd group of a block: a window of 2 steps of 4-frame stacks
# spans 5 cells, so it inflates 1 or 2 groups of 8 (12 frames on average);
# groups of 16 cost 43 B a Pong frame but inflate 20 frames a window, groups
# of 4 inflate 8 but cost 72 B.
GROUP_CELLS = 8
CODECS = ('zstd', 'zlib')
HEADER_BYTES = 2  # Bytes of a group's cell count.
_GROUP_COUNT = struct.Struct('<H')  # A container's group count.


def _raw(rows: np.ndarray, frames: Sequence[np.ndarray]) -> bytes:
  """A group's bytes before compression."""
  counts = len(frames).to_bytes(HEADER_BYTES, 'little') + bytes(
      len(f) for f in frames)
  parts = [counts, np.ascontiguousarray(rows).tobytes()]
  parts += [np.ascontiguousarray(f).tobytes() for f in frames]
  return b''.join(parts)


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
    return zstd.compress(raw, level=ZSTD_LEVEL)
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
  """Bytes before the first group of a block's container.

  Args:
    groups: the container's groups.

  Returns:
    2 (the group count) + 4 per group (its end).
  """
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
  """zstd groups of a block.

  Args:
    block_length: cells per block.

  Returns:
    `ceil(block_length / GROUP_CELLS)`.
  """
  return -(-block_length // GROUP_CELLS)


def empty_group(row_bytes: int) -> bytes:
  """A zstd group of `GROUP_CELLS` cells without frames and with zero rows:
  what a window that needs fewer groups inflates in place of the rest.

  Args:
    row_bytes: bytes of a packed row.

  Returns:
    The compressed group.
  """
  return encode(np.zeros([GROUP_CELLS, row_bytes], np.uint8),
                [np.zeros([0], np.uint8)] * GROUP_CELLS, codec='zstd')


def encode_block(rows: np.ndarray, news: Sequence[np.ndarray], *,
                 codec: str) -> bytes:
  """One blob of a block of consecutive cells.

  Args:
    rows: `uint8[block_length, row_bytes]`, the cells' packed rows.
    news: per used cell, its new frames (the first a whole stack); the
      cells after them hold none.
    codec: 'zstd' (a container of groups of `GROUP_CELLS` cells) or 'zlib'
      (one group).

  Returns:
    The blob of `block_length` cells (zstd: padded to whole groups).

  Raises:
    ZstdOpMissingError: if the codec is zstd and the op is not built.
  """
  empty = np.zeros([0], np.uint8)
  news = list(news)
  if codec == 'zlib':
    return zlib.compress(_raw(rows, news + [empty] * (len(rows) - len(news))),
                         BLOCK_ZLIB_LEVEL)
  cells = block_groups(len(rows)) * GROUP_CELLS
  padded = np.zeros([cells, rows.shape[1]], np.uint8)
  padded[:len(rows)] = rows
  news += [empty] * (cells - len(news))
  groups = [zstd.compress(_raw(padded[g:g + GROUP_CELLS],
                               news[g:g + GROUP_CELLS]),
                          level=BLOCK_ZSTD_LEVEL)
            for g in range(0, cells, GROUP_CELLS)]
  ends = np.cumsum([len(g) for g in groups]).astype('<u4')
  return b''.join([_GROUP_COUNT.pack(len(groups)), ends.tobytes()] + groups)
