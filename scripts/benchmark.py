"""Side-by-side benchmark of smart_replay against the stock TF-Agents path.

Prints a table of medians and ratios (ours / stock) with the targets, and
writes OUTPUT_DIR/benchmark.json and OUTPUT_DIR/benchmark.png. See the README
section "Speed, and the benchmark" for what is measured.

Usage:
  python scripts/benchmark.py                 # 1,000,000 steps (~10 min)
  python scripts/benchmark.py --steps=100000 --repeats=3
  python scripts/benchmark.py --curve_sizes=100000,1000000,3000000
  python scripts/benchmark.py --steps=20000 --repeats=2 --observation_shape=84,84,4 --observation_dtype=uint8
"""

from absl import app
from absl import flags
from absl import logging

from smart_replay_benchmarks import benchmark_lib as benchmark
from smart_replay_benchmarks import curve

FLAGS = flags.FLAGS
flags.DEFINE_integer('steps', 1_000_000, 'Steps written into each compared '
                     'buffer (checkpoint and memory are measured on it).',
                     lower_bound=1)
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
flags.DEFINE_list('curve_sizes', [], 'Buffer sizes in steps of the size '
                  'curve, e.g. 100000,1000000,3000000 (default: no curve).')


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
  workload = benchmark.Workload(
      steps=FLAGS.steps, repeats=FLAGS.repeats,
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
