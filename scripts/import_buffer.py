r"""Takes over a buffer written without smart_replay: imports a Reverb checkpoint.

Reads the newest complete plain Reverb checkpoint at --source (a folder
written by `py_client.checkpoint()` or TF-Agents' `ReverbCheckpointer`, or
their root), checks it against the agent's saved `collect_data_spec`, and
writes every item with its priority into a new smart_replay buffer
directory, ready for `load_replay_buffer()`.

Examples:
  smart-replay-import --source=old/checkpoint_dir --checkpoint_dir=buffers/run1 \
      --spec_file=agent_spec.json

Exit codes: 0 done; 2 bad flags, no checkpoint, or a spec that is not what is
stored (the message says which); 130 interrupted (nothing is written).
"""

import sys

from smart_replay.apps import native_logs  # pylint: disable=g-bad-import-order
native_logs.install(sys.argv)  # first: quiets TensorFlow/Reverb C++ logs
# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

from smart_replay.apps import binary
from smart_replay.apps import cli

FLAGS = flags.FLAGS
flags.DEFINE_string('source', None, 'A plain Reverb checkpoint folder, or a '
                    'root of timestamped ones (the newest is read).')
flags.DEFINE_string('checkpoint_dir', None, 'The smart_replay buffer '
                    'directory to write.')
flags.DEFINE_string('spec_file', None, 'The collect_data_spec, saved with '
                    'smart_replay.spec.specs.save_spec.')
flags.DEFINE_string('table', None, 'The table to import (default: the only '
                    'one).')
flags.DEFINE_string('table_name', 'experience', 'Its name in the new buffer.')
flags.DEFINE_integer('capacity', None, 'The new buffer\'s capacity (default: '
                     'the stored table\'s max_size).', lower_bound=1)
flags.DEFINE_enum('layout', None, ['packed', 'columns'], 'How the new buffer '
                  'stores steps (default: packed when the spec packs).')
flags.DEFINE_boolean('overwrite', False, 'Replace checkpoints already in '
                     '--checkpoint_dir.')
flags.mark_flags_as_required(['source', 'checkpoint_dir', 'spec_file'])


def main(argv):
  """Imports --source into --checkpoint_dir.

  Args:
    argv: `[program]`; no positional arguments.

  Returns:
    The process exit code (see the module docstring).

  Raises:
    app.UsageError: for positional arguments.
  """
  # Imported here: --help and a mistyped flag answer without loading
  # TensorFlow.
  # pylint: disable=g-import-not-at-top
  from smart_replay.spec import specs
  from smart_replay.tools import takeover
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  def work(stop):
    result = takeover.import_reverb_checkpoint(
        FLAGS.source, FLAGS.checkpoint_dir,
        data_spec=specs.load_spec(FLAGS.spec_file), table=FLAGS.table,
        table_name=FLAGS.table_name, capacity=FLAGS.capacity,
        layout=FLAGS.layout, overwrite=FLAGS.overwrite, stop_requested=stop)
    print(f'Imported {result.items} items ({result.steps} steps, '
          f'{result.sequence_length} per item) of table {result.table!r} '
          f'from {result.source} into {result.checkpoint}')
  _, exit_code, _ = cli.run_stoppable(
      work, verbose=FLAGS.verbose,
 quit_message='Interrupted: nothing was imported.',
      flag_names=('source', 'checkpoint_dir', 'table', 'table_name',
                  'capacity', 'layout', 'overwrite'))
  return exit_code or 0


def run():
  """Console-script entry point (`smart-replay-import`)."""
  binary.run(main)


if __name__ == '__main__':
  run()
