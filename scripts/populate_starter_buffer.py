r"""Populates a starter replay buffer from a baseline policy.

Examples:
  smart-replay-populate --buffer_name=office --num_runs=10
  smart-replay-populate --buffer_name=cartpole --env=gymnasium:CartPole-v1 \
      --steps_per_run=500 --num_runs=4
  smart-replay-populate --buffer_name=trained --env=gymnasium:CartPole-v1 \
      --policy=saved:/path/to/policy_saver_dir
  smart-replay-populate --buffer_name=pong --env=atari:Pong --policy=random
  smart-replay-populate --buffer_name=office --gin_file=populate_thermal.gin

Also runnable as `python -m smart_replay_scripts.populate_starter_buffer` once
installed (or `python -m scripts.populate_starter_buffer` from the repository).
Flags given on the command line override gin; other settings come from gin
files/bindings, then from the defaults of `populate_starter_buffer`.

Exit codes: 0 done; 2 bad flags or an existing buffer; 128 + signal number
after SIGINT/SIGTERM (a final checkpoint was written; continue with --resume).
A second SIGINT/SIGTERM quits at once, without the final checkpoint.

Progress: a bar on a terminal, a log line every 10 s otherwise (a log file,
CI); --quiet shows warnings and errors only.
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
flags.DEFINE_string('buffer_name', None, 'Plain name of the starter buffer.')
flags.DEFINE_string('output_dir', './starter_buffers',
                    'Directory holding starter buffers.')
flags.DEFINE_integer('capacity', 50_000, 'Buffer capacity in items.',
                     lower_bound=1)
flags.DEFINE_integer('steps_per_run', 288, 'Policy steps per run.',
                     lower_bound=1)
flags.DEFINE_integer('num_runs', 10, 'Number of runs.', lower_bound=1)
flags.DEFINE_integer('sequence_length', 2, 'Steps per item.', lower_bound=1)
flags.DEFINE_string('env', 'thermal', "'thermal', 'gymnasium:<id>', "
                    "'atari:<Game>' (e.g. atari:Pong; the atari extra) or "
                    "'gym:<id>' (gym 0.23).")
flags.DEFINE_string('policy', 'baseline',
                    "'baseline', 'schedule', 'scripted', 'random' or "
                    "'saved:<policy_saver dir>'.")
flags.DEFINE_integer('seed', 0, 'Environment and random-policy seed.')
flags.DEFINE_multi_string('gin_file', [], 'Gin config: a path, or the name '
                          'of a shipped config (repeatable).')
flags.DEFINE_multi_string('gin_bindings', [], 'Gin binding (repeatable).')
flags.DEFINE_boolean('overwrite', False, 'Replace an existing buffer.')
flags.DEFINE_boolean('resume', False,
                     'Continue an existing buffer up to the requested total.')
flags.DEFINE_boolean('checkpoint_every_run', True,
                     'Checkpoint after every run (not only at the end).')
flags.mark_flag_as_required('buffer_name')

# Passed to populate_starter_buffer only when given on the command line, so
# that gin files can set them too.
_OPTIONAL = ('output_dir', 'capacity', 'steps_per_run', 'num_runs',
             'sequence_length', 'env', 'policy', 'seed', 'overwrite', 'resume',
             'checkpoint_every_run')


def main(argv):
  """Parses gin, installs the signal handlers, runs populate_starter_buffer.

  Args:
    argv: leftover command-line arguments (none are accepted).

  Returns:
    The process exit code (see the module docstring).

  Raises:
    app.UsageError: if arguments are left over.
  """
  # Imported here: --help and a mistyped flag answer without loading
  # TensorFlow.
  # pylint: disable=g-import-not-at-top
  from smart_replay.apps import populate
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  binary.parse_gin(FLAGS.gin_file, FLAGS.gin_bindings)
  given = {name: FLAGS[name].value for name in _OPTIONAL if FLAGS[name].present}
  result, exit_code, stop = cli.run_stoppable(
      lambda stop: populate.populate_starter_buffer(
          buffer_name=FLAGS.buffer_name, show_progress=binary.show_progress(),
          stop_requested=stop, **given),
      verbose=FLAGS.verbose,
      quit_message='Quit without a final checkpoint; the last completed '
      'checkpoint loads, and --resume continues from it.',
      flag_names=_OPTIONAL)
  if exit_code is not None:
    return exit_code
  if result.interrupted:
    print(result.summary(), file=sys.stderr)
    return cli.interrupted_exit_code(stop)
  print(result.summary())
  return 0


def run():
  """Console-script entry point (`smart-replay-populate`)."""
  binary.run(main)


if __name__ == '__main__':
  run()
