r"""Does a starter buffer help? No starter, copied, fixed and annealed mixes.

Examples:
  smart-replay-experiment --setup=cartpole --output_dir=experiments
  smart-replay-experiment --setup=thermal --output_dir=experiments
  smart-replay-experiment --setup=cartpole --seeds=0 --num_train_steps=1000 \
      --output_dir=/tmp/quick                  # a quick look

For the setup (CartPole: DQN from the scripted policy's starter; thermal:
SAC from the schedule policy's), populates the starter once, then trains each
variant with each seed (see `smart_replay.apps.mixing_experiment`) and writes
into <output_dir>/<setup>/: the runs, report.json, <setup>.png (greedy
return against train steps, the starter's policy as a reference line) and
table.md. Run it again after an interruption to continue where it stopped.
`make experiment` runs both setups.

Exit codes: 0 done; 2 bad input; 128 + signal number after SIGINT/SIGTERM
(the current run wrote a final checkpoint; run again to continue).
"""

import sys

from smart_replay.apps import native_logs  # pylint: disable=g-bad-import-order
native_logs.install(sys.argv)  # first: quiets TensorFlow/Reverb C++ logs
# pylint: disable=g-import-not-at-top,wrong-import-position
import os

from absl import app
from absl import flags

from smart_replay.apps import binary
from smart_replay.apps import cli
from smart_replay.apps import mixing_experiment

FLAGS = flags.FLAGS
flags.DEFINE_enum('setup', None, sorted(mixing_experiment.SETUPS),
                  'The environment and agent to compare on.')
flags.DEFINE_string('output_dir', 'experiments', 'Where the runs, figure and '
                    'table go (<output_dir>/<setup>/).')
flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds of every variant.')
flags.DEFINE_integer('num_train_steps', None, 'Train steps per run (default: '
                     "the setup's).", lower_bound=1)
flags.mark_flags_as_required(['setup'])


def main(argv):
  """Runs the experiment for --setup and prints where the results are.

  Args:
    argv: leftover command-line arguments (none are accepted).

  Returns:
    The process exit code (see the module docstring).

  Raises:
    app.UsageError: if arguments are left over or a seed is not an integer.
  """
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    seeds = [int(s) for s in FLAGS.seeds]
  except ValueError:
    raise app.UsageError(f'--seeds must be integers, got {FLAGS.seeds}') \
        from None
  _, exit_code, stop = cli.run_stoppable(
      lambda stop: mixing_experiment.run_experiment(
          setup_name=FLAGS.setup, output_dir=FLAGS.output_dir, seeds=seeds,
          num_train_steps=FLAGS.num_train_steps, stop_requested=stop),
      verbose=FLAGS.verbose,
      quit_message='Quit; run again to continue from the last checkpoints.',
      flag_names=('num_train_steps', 'seeds', 'output_dir'))
  if exit_code is not None:
    return exit_code
  root = os.path.join(os.path.abspath(FLAGS.output_dir), FLAGS.setup)
  with open(os.path.join(root, 'table.md')) as f:
    print(f.read())
  print(f'Figure: {os.path.join(root, FLAGS.setup + ".png")}')
  if stop():
    print('Interrupted; run again to continue.', file=sys.stderr)
    return cli.interrupted_exit_code(stop)
  return 0


def run():
  """Console-script entry point (`smart-replay-experiment`)."""
  binary.run(main)


if __name__ == '__main__':
  run()
