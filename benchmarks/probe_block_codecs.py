"""Probe (issue 34): zstd for low-dimensional packed items, or not.

A block of packed items (`TableConfig(block_length=32)`) of the benchmark's
low-dimensional stream (float32[32] observations, smooth or noise) is one
Reverb step of 32 packed rows, which Reverb compresses in its chunk with
snappy. This probe compares that with zstd over the same block (the op's
library, levels 1, 3 and 9): bytes per step, and what inflating a block in
the graph would add per sampled window (`zstd.decode`, 64 blocks per call).

Run: .venv/bin/python benchmarks/probe_block_codecs.py (seconds). Measured
2026-11-27 on 2 cores, 1,280 blocks of 32 steps, B/step (raw 160):

  stream   snappy (Reverb)   zstd 1   zstd 3   zstd 9   inflate us/block
  smooth        131.6         109.8    106.3    104.7        12
  noise         159.4         143.4    142.0    140.9        11

zstd would take 18-27 B/step off about 194 B/step of server memory (1.21x
raw, docs/benchmarks.md), but every sampled window would inflate its block
(11-12 us, against about 9 us a window for all of sampling today with one
window per block, and 2.6 us with 8): packed items of low-dimensional steps
stay on Reverb's own compression.
"""

import time

import numpy as np
import tensorflow as tf
import tree

import cramjam
from smart_replay.layouts import packed_steps
from smart_replay.ops import zstd
from smart_replay_benchmarks import workload as workload_lib

_BLOCK = 32


def measure(observation: str):
  """Compresses blocks of the low-dimensional stream and times inflating.

  Args:
    observation: 'smooth' or 'noise' (see `workload.Workload`).

  Returns:
    (raw bytes per step, snappy bytes per step, {level: zstd bytes per
    step}, inflate us per block).
  """
  workload = workload_lib.Workload(steps=40_960, observation=observation)
  layout = packed_steps.Layout('packed', workload.spec)
  steps = workload_lib.make_steps(workload, 0, 40_960)
  rows = np.stack([layout.columns(tree.flatten(s))[0] for s in steps])
  blocks = [b.tobytes() for b in rows.reshape(-1, _BLOCK, rows.shape[-1])]
  snappy = np.mean([len(cramjam.snappy.compress_raw(b)) for b in blocks])
  sizes, blobs = {}, None
  for level in (1, 3, 9):
    blobs = [zstd.compress(b, level=level) for b in blocks]
    sizes[level] = np.mean([len(b) for b in blobs]) / _BLOCK
  batch = tf.constant(np.array(blobs[:64], object))
  zstd.decode(batch)
  start = time.perf_counter()
  for _ in range(50):
    zstd.decode(batch)
  inflate = (time.perf_counter() - start) / 50 / 64 * 1e6
  return rows.shape[-1], snappy / _BLOCK, sizes, inflate


def main():
  """Prints the table for both streams."""
  zstd.require()
  print('stream   raw  snappy (Reverb)  zstd 1  zstd 3  zstd 9  inflate '
        'us/block')
  for observation in ('smooth', 'noise'):
    raw, snappy, sizes, inflate = measure(observation)
    print(f'{observation:7s} {raw:4d} {snappy:10.1f}       ' +
          ''.join(f'{sizes[l]:8.1f}' for l in (1, 3, 9)) +
          f'{inflate:10.1f}')


if __name__ == '__main__':
  main()
