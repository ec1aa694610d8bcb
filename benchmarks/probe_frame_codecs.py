"""Probe (issue 25): how small a Pong frame gets, and what inflating costs.

The newest frame of each step of the benchmark's real Pong stream (84x84
uint8, random policy, sticky actions), compressed in groups of 1, 4, 8 and 32
consecutive frames with zlib (the only codec TensorFlow 2.15 decodes inside
the graph), zstd (cramjam) and lzma (the stdlib), and with zlib over the
frame-to-frame differences. For each: bytes per frame and decode time per
frame. It shows the floor the checkpoint and memory targets meet: stock
TF-Agents + Reverb checkpoints are already zlib-compressed by Reverb (363 B
per Pong step on disk), so a tenth of that (36 B) is below what any of these
codecs reaches over 32 frames.

Run: .venv/bin/python benchmarks/probe_frame_codecs.py [--frames=4000]
(about 1 minute; makes or reuses the benchmark's frame cache under
benchmark_results/). Measured 2026-11-26 on 2 cores, 4,000 frames:

  codec          1 frame    4 frames   8 frames  32 frames   (B/frame)
  zlib 1           231        138        119        104
  zlib 6           170         87         70         56
  zlib 9           165         83         66         52
  zlib 9 of diffs  165         97         78         63
  zstd 3           170         75         57         44
  lzma 6           214         86         61         38
  decode: zlib 3-6 us/frame at level 1, 10-13 us/frame at levels 6-9;
  zstd 1-2 us/frame over 8-32 frames.
"""
import argparse
import lzma
import time
import zlib

import cramjam
import numpy as np

from smart_replay_benchmarks import atari_frames


def _codecs():
  """(name, compress, decompress) for each codec measured."""
  zstd = cramjam.zstd
  return [
      ('zlib 1', lambda b: zlib.compress(b, 1), zlib.decompress),
      ('zlib 6', lambda b: zlib.compress(b, 6), zlib.decompress),
      ('zlib 9', lambda b: zlib.compress(b, 9), zlib.decompress),
      ('zstd 3', lambda b: bytes(zstd.compress(b, 3)),
       lambda c: bytes(zstd.decompress(c))),
      ('lzma 6', lambda b: lzma.compress(b, preset=6), lzma.decompress),
  ]


def measure(frames: np.ndarray, group: int, compress, decompress,
            diffs: bool = False):
  """Mean compressed bytes and decode microseconds per frame.

  Args:
    frames: `uint8[n, 84, 84]`, consecutive newest frames.
    group: frames compressed together.
    compress: bytes -> bytes.
    decompress: bytes -> bytes.
    diffs: compress each frame's difference to the previous one (mod 256;
      the group's first frame whole) instead of the frame.

  Returns:
    `(bytes_per_frame, decode_us_per_frame)`.
  """
  sizes, seconds = [], 0.0
  for start in range(0, len(frames) - group + 1, group):
    block = frames[start:start + group].copy()
    if diffs:
      block[1:] = frames[start + 1:start + group] - frames[start:start +
                                                           group - 1]
    raw = block.tobytes()
    packed = compress(raw)
    began = time.perf_counter()
    assert decompress(packed) == raw
    seconds += time.perf_counter() - began
    sizes.append(len(packed))
  return (float(np.mean(sizes)) / group,
          seconds / (len(sizes) * group) * 1e6)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--frames', type=int, default=4000)
  parser.add_argument('--output_dir', default='benchmark_results')
  args = parser.parse_args()
  stream = atari_frames.cached_frames(args.output_dir, args.frames)
  frames = np.ascontiguousarray(stream['observation'][:, -1])
  print(f'{len(frames)} Pong frames of {frames[0].nbytes} bytes; per codec, '
        'bytes and decode time per frame in groups of 1, 4, 8 and 32 frames')
  rows = [(name, c, d, False) for name, c, d in _codecs()]
  rows.append(('zlib 9 of diffs', rows[2][1], rows[2][2], True))
  for name, compress, decompress, diffs in rows:
    cells = [measure(frames, g, compress, decompress, diffs)
             for g in (1, 4, 8, 32)]
    print(f'{name:16s}' + ''.join(f'{b:7.1f} B {us:5.1f} us  '
                                   for b, us in cells))


if __name__ == '__main__':
  main()
