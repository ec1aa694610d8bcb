"""Second half of `make demo`: load a starter buffer and print a summary.

Usage:
  smart-replay-demo --buffer_dir=demo_output/demo_seq2_1152steps
"""

import sys

from smart_replay.apps import native_logs  # pylint: disable=g-bad-import-order
native_logs.install(sys.argv)  # first: quiets TensorFlow/Reverb C++ logs
# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

from smart_replay.apps import binary

FLAGS = flags.FLAGS
flags.DEFINE_string('buffer_dir', None, 'The buffer directory to summarize.')
flags.DEFINE_integer('batch_size', 256, 'Size of the sampled batch.',
                     lower_bound=1)
flags.DEFINE_multi_string('gin_file', [], 'Gin config: a path, or the name '
                          'of a shipped config (repeatable).')
flags.DEFINE_multi_string('gin_bindings', [], 'Gin bindings.')
flags.mark_flag_as_required('buffer_dir')


def main(argv):
  """Prints the summary of --buffer_dir.

  Args:
    argv: leftover command-line arguments (none are accepted).

  Returns:
    0, or 2 if the buffer cannot be loaded.

  Raises:
    app.UsageError: if arguments are left over.
  """
  # Imported here: --help and a mistyped flag answer without loading
  # TensorFlow.
  # pylint: disable=g-import-not-at-top
  from smart_replay import errors
  from smart_replay.apps import demo
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  binary.parse_gin(FLAGS.gin_file, FLAGS.gin_bindings)
  try:
    summary = demo.summarize_buffer(FLAGS.buffer_dir,
                                    batch_size=FLAGS.batch_size)
  except (ValueError, errors.SmartReplayError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print('smart_replay demo: the starter buffer, loaded in a fresh process')
  for key, value in summary.items():
    print(f'  {key:20s} {value}')
  return 0


def run():
  """Console-script entry point (`smart-replay-demo`)."""
  binary.run(main)


if __name__ == '__main__':
  run()
