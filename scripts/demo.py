"""`make demo`: collect CartPole steps into a buffer, checkpoint, reload, sample.

Usage:
  python scripts/demo.py --output_dir=demo_output [--steps=2000]
      [--gin_file=configs/default.gin] [--gin_bindings='run_demo.capacity=5000']
"""

from absl import app
from absl import flags
import gin

from smart_replay import demo

FLAGS = flags.FLAGS
flags.DEFINE_string('output_dir', 'demo_output', 'Where the buffer is written.')
flags.DEFINE_integer('steps', 2000, 'Environment steps to collect.')
flags.DEFINE_boolean('quiet', False, 'No progress bar (for logs).')
flags.DEFINE_multi_string('gin_file', [], 'Gin config files.')
flags.DEFINE_multi_string('gin_bindings', [], 'Gin bindings.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  gin.parse_config_files_and_bindings(FLAGS.gin_file, FLAGS.gin_bindings)
  summary = demo.run_demo(output_dir=FLAGS.output_dir, steps=FLAGS.steps,
                          show_progress=not FLAGS.quiet)
  print('smart_replay demo summary')
  for key, value in summary.items():
    print(f'  {key:18s} {value}')


if __name__ == '__main__':
  app.run(main)
