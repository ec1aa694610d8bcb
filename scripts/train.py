r"""Trains a TF-Agents agent from a starter buffer, resumable after a crash.

Examples:
  smart-replay-train --starter_dir=starter_buffers/cartpole_seq2_2000steps \
      --run_dir=runs/dqn1 --gin_file=train_dqn_cartpole.gin
  smart-replay-train --starter_dir=starter_buffers/office_seq2_2880steps \
      --run_dir=runs/sac1 --gin_file=train_sac_thermal.gin
  smart-replay-train ... --resume          # after an interruption or a crash
  smart-replay-train ... --starter_mode=mix --starter_fraction=0.5 \
      --starter_fraction_final=0.1 --starter_fraction_steps=50000

Capacity, sequence length and spec come from the starter's manifest, the
environment from its provenance; the starter is only read. --starter_mode=mix
serves it as a read-only table beside the run's own and draws each batch
element from it with probability --starter_fraction (annealed with
--starter_fraction_final/--starter_fraction_steps); the run's checkpoints
then refer to the starter by path and fingerprint (if it moves, resume with
--starter_dir=<new path>). The run writes
<run_dir>/buffer, <run_dir>/agent (paired checkpoints), <run_dir>/train
(TensorBoard: TF-Agents' collect metrics, the agent's and the buffer's
scalars), <run_dir>/eval (TensorBoard: the greedy return) and
<run_dir>/result.json. Progress: a bar on a terminal, a log line every 10 s
otherwise.

Gin (--gin_file, --gin_bindings) binds the groups of
smart_replay.apps.train_config by the flags' names (AgentSetup.agent,
StarterUse.starter_mode, TrainLoop.batch_size, RunOutput.overwrite, ...) and
the agents' networks (make_dqn_agent.*, make_sac_agent.*); a flag given on
the command line wins over gin.

Exit codes: 0 done; 2 bad input or an existing run; 128 + signal number after
SIGINT/SIGTERM (a final paired checkpoint was written; continue with --resume).
"""

import sys

from smart_replay.apps import native_logs  # pylint: disable=g-bad-import-order
native_logs.install(sys.argv)  # first: quiets TensorFlow/Reverb C++ logs
# pylint: disable=g-import-not-at-top,wrong-import-position
import dataclasses
import json
import os

from absl import app
from absl import flags

from smart_replay.apps import binary
from smart_replay.apps import cli

FLAGS = flags.FLAGS
flags.DEFINE_string('starter_dir', None, 'Starter buffer directory.')
flags.DEFINE_string('run_dir', None, 'This run\'s directory.')
flags.DEFINE_string('agent', 'auto', "'auto', 'dqn' or 'sac'.")
flags.DEFINE_string('env', None, "Environment: 'thermal', "
                    "'gymnasium:<id>', 'atari:<Game>' or 'gym:<id>'; "
                    "default: the starter's.")
flags.DEFINE_integer('num_train_steps', 2000, 'Train step to reach.',
                     lower_bound=1)
flags.DEFINE_integer('collect_steps_per_iteration', 100,
                     'Actor steps per iteration.', lower_bound=1)
flags.DEFINE_integer('train_steps_per_iteration', 100,
                     'Learner steps per iteration.', lower_bound=1)
flags.DEFINE_integer('batch_size', 64, 'Training batch size.', lower_bound=1)
flags.DEFINE_integer('checkpoint_every', 500,
                     'Train steps between paired checkpoints.', lower_bound=1)
flags.DEFINE_integer('seed', 0, 'Seed.')
flags.DEFINE_integer('eval_episodes', 5, 'Greedy evaluation episodes (at '
                     'the end, and every --eval_interval train steps).',
                     lower_bound=0)
flags.DEFINE_integer('eval_interval', 0, 'Train steps between evaluations '
                     '(0: only at the end).', lower_bound=0)
flags.DEFINE_enum('starter_mode', 'copy', ['copy', 'mix', 'none'],
                  "How the starter's data is used: 'copy' into the run's "
                  "buffer (then evicted FIFO), 'mix' a read-only starter "
                  "table into each batch (--starter_fraction), or 'none'.")
flags.DEFINE_float('starter_fraction', None, "'mix': the starter's share of "
                   'each batch at train step 0, in [0, 1] (default 0.5).')
flags.DEFINE_float('starter_fraction_final', None, "'mix': the share to "
                   'anneal to over --starter_fraction_steps (default: fixed).')
flags.DEFINE_integer('starter_fraction_steps', None, "'mix': train steps to "
                     'anneal the share over.', lower_bound=1)
flags.DEFINE_enum('starter_fraction_schedule', 'linear',
                  ['linear', 'exponential'], "'mix': how the share is "
                  'annealed (exponential: by the same factor every step).')
flags.DEFINE_boolean('resume', False, 'Continue run_dir from its newest pair.')
flags.DEFINE_boolean('overwrite', False, 'Replace an existing run.')
flags.DEFINE_multi_string('gin_file', [], 'Gin config: a path, or the name '
                          'of a shipped config (repeatable).')
flags.DEFINE_multi_string('gin_bindings', [], 'Gin binding (repeatable).')
flags.mark_flags_as_required(['starter_dir', 'run_dir'])

_OPTIONAL = ('agent', 'env', 'num_train_steps', 'collect_steps_per_iteration',
             'train_steps_per_iteration', 'batch_size', 'checkpoint_every',
             'seed', 'eval_episodes', 'eval_interval', 'resume', 'overwrite',
             'starter_mode', 'starter_fraction', 'starter_fraction_final',
             'starter_fraction_steps', 'starter_fraction_schedule')


def main(argv):
  """Parses gin, installs the signal handlers, runs train_from_starter.

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
  from smart_replay.apps import training
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  binary.parse_gin(FLAGS.gin_file, FLAGS.gin_bindings)
  given = {name: FLAGS[name].value for name in _OPTIONAL if FLAGS[name].present}
  result, exit_code, stop = cli.run_stoppable(
      lambda stop: training.train_from_starter(
          starter_dir=FLAGS.starter_dir, run_dir=FLAGS.run_dir,
          show_progress=binary.show_progress(), stop_requested=stop,
          **given),
      verbose=FLAGS.verbose,
      quit_message='Quit without a final checkpoint; --resume continues from '
      'the last paired checkpoint.',
      flag_names=_OPTIONAL)
  if exit_code is not None:
    return exit_code
  record = dataclasses.asdict(result)
  with open(os.path.join(result.run_dir, 'result.json'), 'w') as f:
    json.dump(record, f, indent=2)
  print(json.dumps(record, indent=2))
  if result.interrupted:
    print(f'Interrupted at train step {result.train_step}; continue with '
          '--resume.', file=sys.stderr)
    return cli.interrupted_exit_code(stop)
  return 0


def run():
  """Console-script entry point (`smart-replay-train`)."""
  binary.run(main)


if __name__ == '__main__':
  run()
