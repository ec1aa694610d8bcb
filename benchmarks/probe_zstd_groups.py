"""Probe (issue 34): zstd levels and group sizes on real Atari frames.

The newest frame of each step of a real ALE stream (the Atari benchmark's:
84x84 uint8, random policy, sticky actions), packed into groups of 1, 4, 8,
16 and 32 consecutive frames as `frame_cells` packs cells, compressed by the
zstd op's library (`smart_replay.ops.zstd.compress`, checksummed) at levels
3, 9 and 19. For each: bytes per frame, encode time per frame, and decode
time per frame by the sampling path's op (`decode_cells`, all the groups of
the stream in one call). It chose the frame layouts' settings: cells alone
at level 3, groups of 8 at level 9 inside a packed-items block.

Run: .venv/bin/python benchmarks/probe_zstd_groups.py --game=Pong
(about a minute per game; makes or reuses the benchmark's frame cache under
benchmark_results/). Measured 2026-11-27 on 2 cores, 2,048 frames of each
game, B/frame (decode us/frame), and encode us/frame at level 9:

  game      group   level 3      level 9      level 19     encode L9
  Pong          1   177 (3.2)    165 (3.4)    158 (3.0)      18
  Pong          4    77 (2.4)     72 (2.3)     66 (2.3)      12
  Pong          8    58 (2.0)     54 (2.0)     48 (2.0)      11
  Pong         16    48 (1.8)     43 (1.8)     38 (1.7)      10
  Pong         32    44 (1.9)     38 (1.7)     32 (1.7)      13
  Breakout      1   292 (5.2)    270 (4.6)    247 (4.4)      26
  Breakout      4    98 (2.6)     93 (2.3)     84 (2.4)      13
  Breakout      8    64 (2.0)     60 (2.1)     55 (2.0)      11
  Breakout     16    47 (1.8)     44 (1.9)     39 (1.8)      11
  Breakout     32    39 (1.8)     35 (1.7)     32 (1.8)      12

Level 19 encodes at about 360 us a frame (an earlier sweep), too slow for a
writer. A window of 2 steps of 4-frame stacks spans 5 cells: over groups of 8
it inflates 1 or 2 groups (12 frames on average), over 16 also 1 or 2 (20
frames), over 32 1 or 2 (about 40 frames).
"""

import argparse
import time

import numpy as np
import tensorflow as tf

from smart_replay.ops import zstd
from smart_replay_benchmarks import atari_frames

_GROUPS = (1, 4, 8, 16, 32)
_LEVELS = (3, 9, 19)


def _group(frames: np.ndarray) -> bytes:
  """A group of cells of one new frame each and no row, as `frame_cells`
  packs them."""
  count = len(frames)
  return (count.to_bytes(2, 'little') + bytes([1] * count) +
          np.ascontiguousarray(frames).tobytes())


def measure(frames: np.ndarray, group: int, level: int):
  """Compresses `frames` in groups and times the sampling path's decode.

  Args:
    frames: `uint8[n, 84, 84]`, consecutive frames.
    group: frames per group.
    level: the zstd level.

  Returns:
    (bytes per frame, decode us per frame, encode us per frame).
  """
  raws = [_group(frames[i:i + group])
          for i in range(0, len(frames) - group + 1, group)]
  start = time.perf_counter()
  blobs = [zstd.compress(r, level=level) for r in raws]
  encode = (time.perf_counter() - start) / (len(raws) * group) * 1e6
  tensor = tf.constant(np.array(blobs, object)[:, None])
  frame_bytes = frames[0].nbytes
  decode = lambda: zstd.decode_cells(tensor, cells=group, row_bytes=0,
                                     frame_bytes=frame_bytes)
  decode()
  start = time.perf_counter()
  for _ in range(5):
    decode()
  seconds = (time.perf_counter() - start) / 5
  size = sum(len(b) for b in blobs) / (len(blobs) * group)
  return size, seconds / (len(blobs) * group) * 1e6, encode


def main():
  """Prints the table for --game."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--game', default=atari_frames.GAME)
  parser.add_argument('--frames', type=int, default=2048)
  parser.add_argument('--output_dir', default='benchmark_results')
  args = parser.parse_args()
  zstd.require()
  stream = atari_frames.cached_frames(args.output_dir, args.frames,
                                      game=args.game)
  frames = np.ascontiguousarray(stream['observation'][:, -1])
  print(f'{len(frames)} {args.game} frames of {frames[0].nbytes} bytes: '
        'B/frame (decode us/frame) per level; encode us/frame at level 9')
  for group in _GROUPS:
    cells = [measure(frames, group, level) for level in _LEVELS]
    print(f'{args.game:9s} {group:5d}  ' +
          ''.join(f'{b:5.0f} ({d:.1f})  ' for b, d, _ in cells) +
          f'{cells[1][2]:6.0f}')


if __name__ == '__main__':
  main()
