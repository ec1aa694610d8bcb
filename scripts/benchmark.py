"""Side-by-side benchmark of smart_replay against the stock TF-Agents path.

Prints a table of medians and ratios (ours / stock) with the targets, and
writes OUTPUT_DIR/benchmark.json and OUTPUT_DIR/benchmark.png. See the README
section "Speed, and the benchmark" for what is measured.

--workload=atari writes real ALE frames of --game (Pong by default; uint8[4,
84, 84], generated once and cached in OUTPUT_DIR/atari_frames/) into stock
TF-Agents and our buffers (the frame stack found by itself: per-window and
packed items; zlib and no frame stack for reference), each side in its own
process (see benchmarks/atari_lib.py); it prints markdown tables and writes
OUTPUT_DIR/atari_benchmark.json and OUTPUT_DIR/atari_benchmark.png.

Usage:
  python scripts/benchmark.py                 # 1,000,000 steps (~10 min)
  python scripts/benchmark.py --steps=100000 --repeats=3
  python scripts/benchmark.py --curve_sizes=100000,1000000,3000000
  python scripts/benchmark.py --steps=20000 --repeats=2 --observation_shape=84,84,4 --observation_dtype=uint8
  python scripts/benchmark.py --workload=atari          # 20,000 Pong steps
  python scripts/benchmark.py --workload=atari --game=Breakout --steps=100000
  python scripts/benchmark.py --workload=atari --steps=20000 \
      --curve_sizes=5000,10000,20000 --sides=stock,ours,ours_blocks
"""

import sys

from absl import app
from absl import flags
from absl import logging

from smart_replay_benchmarks import atari_frames
from smart_replay_benchmarks import atari_lib
from smart_replay_benchmarks import atari_report
from smart_replay_benchmarks import benchmark_lib as benchmark
from smart_replay_benchmarks import curve

_DEFAULT_STEPS = {'synthetic': 1_000_000,
                  'atari': atari_lib.AtariWorkload.steps}

FLAGS = flags.FLAGS
flags.DEFINE_enum('workload', 'synthetic', ['synthetic', 'atari'],
                  'synthetic: generated float or image-like steps, every '
                  'layout and the Reverb floor; atari: real Pong frames, '
                  'stock against our frame_stack layouts.')
flags.DEFINE_integer('steps', None, 'Steps written into each compared '
                     'buffer (checkpoint and memory are measured on it); '
                     f'default {_DEFAULT_STEPS["synthetic"]:,} (synthetic), '
                     f'{_DEFAULT_STEPS["atari"]:,} (atari).', lower_bound=1)
flags.DEFINE_list('sides', list(atari_lib.DEFAULT_SIDES), 'atari: the '
                  'compared sides, stock first (ours: per-window with '
                  'frame_stack; ours_blocks: packed items of 32 steps with '
                  'frame_stack; ours_noframes: per-window without it).')
flags.DEFINE_float('sample_seconds', atari_lib.AtariWorkload.sample_seconds,
                   'atari: seconds of sampling timed per side.',
                   lower_bound=0.1)
flags.DEFINE_integer('repeats', 5, 'Alternating repeats (each writes '
                     'steps / repeats steps per path).', lower_bound=1)
flags.DEFINE_integer('observation_size', 32, 'Floats per observation.',
                     lower_bound=1)
flags.DEFINE_enum('observation', 'smooth', ['smooth', 'noise'],
                  'smooth: sensor-like values; noise: random normal floats.')
flags.DEFINE_integer('episode_length', 200, 'Steps per episode.', lower_bound=2)
flags.DEFINE_integer('num_envs', 8, 'Environments of the batched observer.',
                     lower_bound=1)
flags.DEFINE_integer('batch_size', 256, 'Sampled items per batch.',
                     lower_bound=1)
flags.DEFINE_integer('sample_batches', 200, 'Batches timed per sampling '
                     'repeat.', lower_bound=1)
flags.DEFINE_integer('chunk_length', None, 'Our observer\'s chunk length '
                     '(default: automatic).', lower_bound=1)
flags.DEFINE_string('output_dir', 'benchmark_results', 'Where benchmark.json, '
                    'benchmark.png and curve.png go.')
flags.DEFINE_list('observation_shape', None, 'The observation\'s shape, e.g. '
                  '84,84,4 (default: [observation_size]).')
flags.DEFINE_enum('observation_dtype', 'float32', ['float32', 'uint8'],
                  'The observation\'s dtype (uint8: image-like).')
flags.DEFINE_string('game', atari_lib.AtariWorkload.game, 'atari: the ALE '
                    "game played, e.g. Pong or Breakout (ale-py's ROMs).")
flags.DEFINE_list('curve_sizes', [], 'Buffer sizes in steps of the size '
                  'curve, e.g. 100000,1000000,3000000 (default: no curve). '
                  'atari: sizes up to --steps, read while writing (default: '
                  'a quarter, half and all of --steps).')


def _run_atari(curve_sizes):
  """Runs --workload=atari with the flags and prints its tables.

  Args:
    curve_sizes: the parsed --curve_sizes (empty: the default curve).
  """
  steps = FLAGS.steps or _DEFAULT_STEPS['atari']
  try:
    workload = atari_lib.AtariWorkload(
        steps=steps, sides=tuple(FLAGS.sides),
        curve_sizes=tuple(curve_sizes or
                          atari_lib.default_curve_sizes(steps)),
        sample_seconds=FLAGS.sample_seconds, game=FLAGS.game)
    atari_frames.check_game(workload.game)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  results = atari_lib.run(workload, FLAGS.output_dir)
  print(atari_report.format_table(results))
  print(f'\nwrote {FLAGS.output_dir}/atari_benchmark.json and '
        f'{FLAGS.output_dir}/atari_benchmark.png')


def main(argv):
  """Runs the benchmark with the flags' workload and prints the table.

  Args:
    argv: leftover command-line arguments (none are accepted).
  """
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.INFO)
  shape = FLAGS.observation_shape
  if shape and not all(d.isdigit() and int(d) > 0 for d in shape):
    raise app.UsageError(f'--observation_shape={",".join(shape)}: expected '
                         'positive integers, e.g. 84,84,4.')
  shape = tuple(int(d) for d in shape) if shape else None
  try:
    curve_sizes = curve.sizes_flag(','.join(FLAGS.curve_sizes))
  except ValueError as e:
    raise app.UsageError(f'--curve_sizes: {e}') from e
  if FLAGS.workload == 'atari':
    try:
      _run_atari(curve_sizes)
    except KeyboardInterrupt:  # Each side's process is killed, its folder gone.
      print('\nInterrupted: no results written.', file=sys.stderr)
      sys.exit(130)
    return
  workload = benchmark.Workload(
      steps=FLAGS.steps or _DEFAULT_STEPS['synthetic'], repeats=FLAGS.repeats,
      observation_size=FLAGS.observation_size, observation=FLAGS.observation,
      episode_length=FLAGS.episode_length, num_envs=FLAGS.num_envs,
      batch_size=FLAGS.batch_size, sample_batches=FLAGS.sample_batches,
      chunk_length=FLAGS.chunk_length, observation_shape=shape,
      observation_dtype=FLAGS.observation_dtype)
  results = benchmark.run(workload, FLAGS.output_dir, curve_sizes)
  print(benchmark.format_table(results))
  print(f'\nwrote {FLAGS.output_dir}/benchmark.json and '
        f'{FLAGS.output_dir}/benchmark.png'
        + (f' and {FLAGS.output_dir}/curve.png' if curve_sizes else ''))


if __name__ == '__main__':
  app.run(main)
