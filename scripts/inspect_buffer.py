r"""Shows what a replay buffer holds: tables, spec, provenance, checkpoints.

Examples:
  smart-replay-inspect starter_buffers/office_seq2_2880steps
  smart-replay-inspect buffer/checkpoints/ckpt-000003 --json
  smart-replay-inspect starter_buffers/office_seq2_2880steps --plot office.png
  smart-replay-inspect buffer-host:8000          # a running smart-replay-serve
  smart-replay-inspect h1:8000,h2:8000,h3:8000   # a sharded buffer: each shard
  smart-replay-inspect BUFFER --export_rlds=out/rlds     # or --export_npz=t.npz
  smart-replay-inspect out/rlds --import_to=buffers/copy # any RLDS dataset

Exit codes: 0 done; 2 no such buffer, a damaged checkpoint, an unreachable
server, or bad flags (the message says which); 128 + the signal number when
SIGINT/SIGTERM stopped it between its parts (inspect writes no checkpoint).
"""

import sys

from smart_replay.apps import native_logs  # pylint: disable=g-bad-import-order
native_logs.install(sys.argv)  # first: quiets TensorFlow/Reverb C++ logs
# pylint: disable=g-import-not-at-top,wrong-import-position
import json
import os

from absl import app
from absl import flags

from smart_replay.apps import binary
from smart_replay.apps import cli
from smart_replay.control import credentials as credentials_lib

FLAGS = flags.FLAGS
flags.DEFINE_boolean('json', False, 'Print JSON instead of text.')
flags.DEFINE_string('plot', None, 'Write the figures to this PNG file '
                    '(buffer directories and checkpoints only).')
flags.DEFINE_string('table', None, 'Table for --plot / --export_*; default '
                    'the first sequence table.')
flags.DEFINE_string('export_rlds', None, 'Write an RLDS dataset (TFDS format) '
                    'here.')
flags.DEFINE_string('export_npz', None, 'Write flat transitions to this .npz.')
flags.DEFINE_string('import_to', None, 'TARGET is an RLDS dataset (TFDS '
                    'format, ours or any other): write it into a new starter '
                    'buffer here.')
flags.DEFINE_string('spec_file', None, 'With --import_to: store the steps '
                    'under this collect_data_spec (saved with '
                    'smart_replay.spec.specs.save_spec), e.g. the agent\'s '
                    'with its action bounds; default the dataset\'s own.')
flags.DEFINE_boolean('overwrite', False, 'Replace existing outputs.')
flags.DEFINE_float('timeout_s', 10.0, 'Wait for a server this long.',
                   lower_bound=0.1)
flags.DEFINE_string('control_token_file', None, 'For a server: a copy of its '
                    'control.token or reader.token (they carry its '
                    'certificate); default: $SMART_REPLAY_CONTROL_TOKEN (with '
                    '--control_tls_ca_file), else the file '
                    '$SMART_REPLAY_CONTROL_TOKEN_FILE names.')
flags.DEFINE_string('control_tls_ca_file', None, 'For a server with '
                    'certificates of your own: the CA that signed them.')
flags.DEFINE_string('control_tls_cert_file', None, 'For mutual TLS: this '
                    "client's certificate.")
flags.DEFINE_string('control_tls_key_file', None, 'For mutual TLS: its key.')


# Inspect is read-only: a stop ends it between its parts, writing nothing
# (an interrupted --import_to leaves no checkpoint in the new buffer).
STOP_MESSAGE = ('Signal %d: stopping when the current read, plot, export or '
                'imported episode is done (send it again to quit at once).')


def _stop_if_requested(stop):
  """Ends the work between its parts once a signal asked to stop."""
  if stop():
    raise KeyboardInterrupt


def _work(target, stop):
  # Imported here: --help and a mistyped flag answer without loading
  # TensorFlow.
  # pylint: disable=g-import-not-at-top
  from smart_replay.control import access as control_access
  from smart_replay.spec import specs
  from smart_replay.tools import export
  from smart_replay.tools import sharded_inspection
  from smart_replay.tools import plots
  from smart_replay.tools import rlds_io
  if FLAGS.import_to:
    if FLAGS.plot or FLAGS.export_rlds or FLAGS.export_npz or FLAGS.json:
      raise ValueError('--import_to takes an exported data set; inspect, '
                       'plot or export the new buffer in a second call.')
    path = rlds_io.import_rlds(
        target, FLAGS.import_to, overwrite=FLAGS.overwrite,
        data_spec=specs.load_spec(FLAGS.spec_file) if FLAGS.spec_file
        else None, stop_requested=stop)
    print(f'Imported {target} into {path}')
    return
  description = sharded_inspection.describe(
      target, timeout_s=FLAGS.timeout_s,
      credentials=credentials_lib.ClientCredentials.resolve(
          token_file=FLAGS.control_token_file,
          tls_ca_file=FLAGS.control_tls_ca_file,
          tls_cert_file=FLAGS.control_tls_cert_file,
          tls_key_file=FLAGS.control_tls_key_file))
  print(json.dumps(description, indent=1) if FLAGS.json else
        sharded_inspection.format_text(description), flush=True)
  local = os.path.exists(target)
  if (FLAGS.plot or FLAGS.export_rlds or FLAGS.export_npz) and not local:
    raise ValueError('--plot and --export_* read checkpoint files; give a '
                     'buffer directory or checkpoint folder (on a server, '
                     "call checkpoint() and use the path it returns).")
  if FLAGS.plot:
    _stop_if_requested(stop)
    titles = plots.plot_buffer(target, FLAGS.plot, table=FLAGS.table)
    print(f'Wrote {FLAGS.plot}: ' + '; '.join(titles), file=sys.stderr)
  for writer, out in ((rlds_io.write_rlds, FLAGS.export_rlds),
                      (export.export_npz, FLAGS.export_npz)):
    if out:
      _stop_if_requested(stop)
      result = writer(target, out, table=FLAGS.table,
                      overwrite=FLAGS.overwrite)
      print(f'Exported {result.items} items of {result.table!r} from '
            f'{result.checkpoint}: {result.steps} steps, {result.episodes} '
            f'episode pieces -> {result.path}', file=sys.stderr)


def main(argv):
  """Describes (and plots / exports) the buffer named on the command line.

  Args:
    argv: `[program, PATH_OR_ADDRESS]`.

  Returns:
    The process exit code (see the module docstring).

  Raises:
    app.UsageError: unless exactly one target is given.
  """
  if len(argv) != 2:
    raise app.UsageError('give one buffer directory, checkpoint folder, '
                         'data set, host:port or host:port,host:port,... '
                         f'(shards); got {argv[1:]}')
  _, exit_code, _ = cli.run_stoppable(lambda stop: _work(argv[1], stop),
                                      verbose=FLAGS.verbose,
                                      quit_message='Interrupted.',
                                      stop_message=STOP_MESSAGE,
                                      flag_names=('overwrite', 'table'))
  return exit_code or 0


def run():
  """Console-script entry point (`smart-replay-inspect`)."""
  binary.run(main)


if __name__ == '__main__':
  run()
