"""Side-by-side benchmark of smart_replay against the stock TF-Agents path.

Prints a table of medians and ratios (ours / stock) with the targets, and
writes OUTPUT_DIR/benchmark.json and OUTPUT_DIR/benchmark.png. See the README
section "Speed, and the benchmark" for what is measured.

--workload=atari writes real ALE frames of each --game (Pong by default;
generated once and cached in OUTPUT_DIR/atari_frames/) into stock TF-Agents
and our buffers (the frame stack found by itself: per-window and packed
items; zlib and no frame stack for reference), each side in its own process
(see benchmarks/atari_lib.py), once with the frames on each --stack_axis
(both by default: uint8[4, 84, 84] and TF-Agents' uint8[84, 84, 4]); it
prints markdown tables, one per game and axis, then every run's ratios side
by side, and writes OUTPUT_DIR/atari_<game>_axis<axis>.json and .png per run
and OUTPUT_DIR/atari_summary.json.

Usage:
  python scripts/benchmark.py                 # 1,000,000 steps (~10 min)
  python scripts/benchmark.py --steps=100000 --repeats=3
  python scripts/benchmark.py --curve_sizes=100000,1000000,3000000
  python scripts/benchmark.py --steps=20000 --repeats=2 --observation_shape=84,84,4 --observation_dtype=uint8
  python scripts/benchmark.py --workload=atari          # 20,000 Pong steps
  python scripts/benchmark.py --workload=atari --game=Pong,Breakout,Seaquest
  python scripts/benchmark.py --workload=atari --game=Breakout --stack_axis=-1 \
      --steps=100000
  python scripts/benchmark.py --workload=dqn_atari --repeats=2
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
from smart_replay_benchmarks import dqn_atari

_DEFAULT_STEPS = {'synthetic': 1_000_000,
                  'atari': atari_lib.AtariWorkload.steps}

FLAGS = flags.FLAGS
flags.DEFINE_enum('workload', 'synthetic', ['synthetic', 'atari',
                                          'dqn_atari'],
                  'synthetic: generated float or image-like steps, every '
                  'layout and the Reverb floor; atari: real Pong frames, '
                  'stock against our frame_stack layouts; dqn_atari: '
                  "TF-Agents' own Atari DQN example with stock Reverb "
                  'against examples/dqn_atari.py, train steps/s.')
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
                     'steps / repeats steps per path; dqn_atari: runs of '
                     'each program).', lower_bound=1)
flags.DEFINE_integer('dqn_iterations', 1000, 'dqn_atari: train iterations '
                     'per run.', lower_bound=200)
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
flags.DEFINE_list('game', [atari_lib.AtariWorkload.game], 'atari: the ALE '
                  "games played, one run each, e.g. Pong,Breakout,Seaquest "
                  "(ale-py's ROMs).")
flags.DEFINE_list('stack_axis', ['0', '-1'], 'atari: where the 4 frames of '
                  'an observation are, one run each: 0 (uint8[4, 84, 84], '
                  'Gymnasium) and/or -1 (uint8[84, 84, 4], TF-Agents).')
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
  axes = []
  for axis in FLAGS.stack_axis:
    if axis not in ('0', '-1'):
      raise app.UsageError(f'--stack_axis={",".join(FLAGS.stack_axis)}: '
                           f'{axis!r} is not 0 or -1.')
    axes.append(int(axis))
  if not FLAGS.game or not axes:
    raise app.UsageError('--game and --stack_axis each need at least one '
                         'value.')
  try:
    workload = atari_lib.AtariWorkload(
        steps=steps, sides=tuple(FLAGS.sides),
        curve_sizes=tuple(curve_sizes or
                          atari_lib.default_curve_sizes(steps)),
        sample_seconds=FLAGS.sample_seconds)
    for game in FLAGS.game:
      atari_frames.check_game(game)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  runs = atari_lib.run_all(workload, FLAGS.game, axes, FLAGS.output_dir)
  for results in runs:
    print(f"\n## {results['stream']['game']}, "
          f"{results['stream']['observation']}\n")
    print(atari_report.format_table(results))
  print('\n## Ratios vs stock, every game and axis\n')
  print(atari_report.format_summary(runs))
  names = ', '.join(r['name'] for r in runs)
  print(f'\nwrote {FLAGS.output_dir}/: {names} (.json, .png each) and '
        'atari_summary.json')


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
  if FLAGS.workload == 'dqn_atari':
    try:
      results = dqn_atari.run(FLAGS.output_dir, repeats=FLAGS.repeats,
                              iterations=FLAGS.dqn_iterations)
    except KeyboardInterrupt:  # subprocess.run killed the running program.
      print('\nInterrupted: no results written.', file=sys.stderr)
      sys.exit(130)
    print(dqn_atari.format_table(results))
    print(f'\nwrote {FLAGS.output_dir}/{dqn_atari.RESULT_FILE}')
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
