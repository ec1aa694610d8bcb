r"""Serves a replay buffer to actors and learners in other processes or machines.

Examples:
  smart-replay-serve --spec_file=buffer/spec.pbtxt --checkpoint_dir=buffer \
      --port=8000 --capacity=1000000 --sequence_length=2 --metrics_port=9090
  smart-replay-serve ... --gin_bindings='ReplayServer.checkpoint_every_s=60'
  smart-replay-serve ... --reverb_host=10.0.0.1 --control_host=10.0.0.1

The spec file is the agent's `collect_data_spec`, saved with
`smart_replay.spec.specs.save_spec` (TF-Agents' spec pbtxt). The buffer's
shape comes from --capacity, --sequence_length and --stride_length when
given, else from gin; its tables and the checkpoint schedule come from gin
(`ReplayBufferManager` and `ReplayServer` bindings). Without --gin_file the
shipped configs/serve.gin is used (1,000,000 items of 2 steps, one uniform
FIFO table, a checkpoint every 10 minutes). An existing buffer in
`--checkpoint_dir` is resumed from its newest verified checkpoint.

The control service (--control_port, default --port + 1) binds 127.0.0.1
unless --control_host says otherwise, serves TLS, and every call must carry a
token: the operator token (<checkpoint_dir>/control.token, made mode 0600 at
the first start, or the one in --control_token_file) for every method, the
reader token (<checkpoint_dir>/reader.token) for those that only read. Both
files carry the server's own certificate (<checkpoint_dir>/control.pem,
unless --control_tls_cert_file is given), which clients pin: they pass a
copy as control_token_file= or $SMART_REPLAY_CONTROL_TOKEN_FILE.
The Prometheus endpoint (--metrics_port) binds 127.0.0.1 unless --metrics_host
says otherwise and asks for the reader token (a Bearer header). Reverb's own
port (--port) has no authentication; it listens on 127.0.0.1 unless
--reverb_host names one interface's address, or 0.0.0.0 / :: for every
interface (actors and learners on other machines). Reverb 0.14 always binds
every interface, so for one address the binary restarts itself (same process
id) with a small LD_PRELOAD library that rewrites that one bind
(smart_replay/ops/bind_address.c, compiled at the first start with the C++
compiler), and checks once serving that the port listens there and nowhere
else. Other users of this machine can still reach 127.0.0.1: see
docs/remote.md, "Security", for an owner-matched firewall rule.
Files and folders the server creates are the user's alone (umask 077).

Exit codes: 0 stopped with a final checkpoint; 2 bad flags, spec or config,
or Reverb's port cannot be bound as --reverb_host asks (the bind-address
library cannot be built or loaded, or the port listens elsewhere); 128 +
signal number if a second SIGINT/SIGTERM quit without the final checkpoint
(the last completed one stays loadable).
"""

import functools
import os
import sys

from smart_replay.apps import native_logs  # pylint: disable=g-bad-import-order
native_logs.install(sys.argv)  # first: quiets TensorFlow/Reverb C++ logs
# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

from smart_replay.apps import binary
from smart_replay.apps import cli

FLAGS = flags.FLAGS
flags.DEFINE_string('spec_file', None,
                    'collect_data_spec saved with '
                    'smart_replay.spec.specs.save_spec.')
flags.DEFINE_string('checkpoint_dir', None, 'Buffer directory (created or '
                    'resumed).')
flags.DEFINE_integer('port', 8000, 'Reverb port (the control service uses '
                     'port + 1 unless --control_port says otherwise).',
                     lower_bound=1, upper_bound=65534)
flags.DEFINE_string('reverb_host', '127.0.0.1', "Address of Reverb's port: "
                    '127.0.0.1 (this machine only), the address of one '
                    "interface, or '0.0.0.0' / '::' (every interface) for "
                    'actors and learners on other machines. Reverb has no '
                    'authentication.')
flags.DEFINE_integer('control_port', None, 'Port of the control service '
                     '(default: --port + 1; checked free before the buffer '
                     'opens).', lower_bound=1, upper_bound=65535)
flags.DEFINE_integer('metrics_port', None, 'Serve Prometheus metrics at '
                     'http://<metrics_host>:<port>/metrics (0: a free port).',
                     lower_bound=0, upper_bound=65535)
flags.DEFINE_string('metrics_host', '127.0.0.1', 'Address of the metrics '
                    "endpoint ('0.0.0.0' for a Prometheus on another "
                    'machine).')
flags.DEFINE_integer('capacity', None, 'Buffer capacity in items (default: '
                     "the gin config's, 1,000,000 in serve.gin).",
                     lower_bound=1)
flags.DEFINE_integer('sequence_length', None, 'Steps per item (default: the '
                     "gin config's, 2 in serve.gin).", lower_bound=1)
flags.DEFINE_integer('stride_length', None, 'Steps between item starts '
                     "(default: the gin config's, 1 in serve.gin).",
                     lower_bound=1)
flags.DEFINE_string('control_host', '127.0.0.1', 'Address of the control '
                    "service (an interface's address, or '0.0.0.0', for "
                    'clients on other machines).')
flags.DEFINE_string('control_token_file', None, 'A file holding the '
                    'operator token (e.g. one shared by the shards of a '
                    'sharded buffer); default: the server\'s own, made at '
                    'first start. Either way clients copy '
                    '<checkpoint_dir>/control.token (it carries the '
                    'certificate they pin).')
flags.DEFINE_boolean('control_auth', True, 'Require the token. '
                     '--nocontrol_auth serves without it: loopback only, '
                     'unless --noprotected_mode.')
flags.DEFINE_boolean('protected_mode', True, 'Refuse to serve beyond '
                     'loopback without authentication.')
flags.DEFINE_string('control_tls_cert_file', None, 'Serve the control '
                    'service (and metrics) over TLS with this certificate '
                    'instead of the server\'s own.')
flags.DEFINE_string('control_tls_key_file', None, 'Its private key.')
flags.DEFINE_string('control_tls_client_ca_file', None, 'Require client '
                    'certificates signed by this CA (mutual TLS).')
flags.DEFINE_multi_string('gin_file', [], 'Gin config: a path, or the name '
                          'of a shipped config (repeatable; default '
                          'serve.gin).')
flags.DEFINE_multi_string('gin_bindings', [], 'Gin binding (repeatable).')
flags.mark_flags_as_required(['spec_file', 'checkpoint_dir'])

# Passed to serve() only when given on the command line, so that gin files
# can set them too.
_OPTIONAL = ('capacity', 'sequence_length', 'stride_length')
DEFAULT_GIN = 'serve.gin'


def main(argv):
  """Parses gin and serves until SIGTERM/SIGINT.

  Args:
    argv: leftover command-line arguments (none are accepted).

  Returns:
    The process exit code (see the module docstring).

  Raises:
    app.UsageError: if arguments are left over.
  """
  os.umask(0o077)  # Before anything is created: files of this user alone.
  # Imported here: --help and a mistyped flag answer without loading
  # TensorFlow; bind_address loads neither TensorFlow nor Reverb.
  # pylint: disable=g-import-not-at-top
  from smart_replay.ops import bind_address
  from smart_replay.control import protocol as control_protocol
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    reverb_host = bind_address.check_host(FLAGS.reverb_host)
  except ValueError as e:
    raise app.UsageError(cli.as_flags(str(e), ['reverb_host'])) from e
  try:
    # Restarts this process with the bind-address library unless it has it
    # (or --reverb_host is every interface); before TensorFlow loads.
    # The library also caps each peer's connections to the control port.
    bind_address.ensure_in_force(
        FLAGS.port, reverb_host, connection_cap=(
            FLAGS.control_port or control_protocol.default_control_port(
                FLAGS.port),
            control_protocol.MAX_CONNECTIONS_PER_PEER))
  except bind_address.BindAddressError as e:
    print(f'error: {e}', file=sys.stderr)
    return cli.EXIT_BAD_INPUT
  except ValueError as e:  # A port out of range.
    raise app.UsageError(cli.as_flags(str(e), ['port', 'control_port'])) from e
  from smart_replay.remote import launch
  from smart_replay.control import access as control_access
  binary.parse_gin(FLAGS.gin_file or [DEFAULT_GIN], FLAGS.gin_bindings)
  _refuse_gin_reverb_host(reverb_host)
  given = {name: FLAGS[name].value for name in _OPTIONAL if FLAGS[name].present}
  access = functools.partial(  # Built inside: a bad one exits 2.
      control_access.ControlAccess, host=FLAGS.control_host,
      token_file=FLAGS.control_token_file, auth=FLAGS.control_auth,
      protected_mode=FLAGS.protected_mode,
      tls_cert_file=FLAGS.control_tls_cert_file,
      tls_key_file=FLAGS.control_tls_key_file,
      tls_client_ca_file=FLAGS.control_tls_client_ca_file)
  path, exit_code, _ = cli.run_stoppable(
      lambda stop: launch.serve(
          spec_file=FLAGS.spec_file, checkpoint_dir=FLAGS.checkpoint_dir,
          port=FLAGS.port, reverb_host=reverb_host,
          control_port=FLAGS.control_port,
          metrics_port=FLAGS.metrics_port,
          metrics_host=FLAGS.metrics_host, access=access(),
          stop_requested=stop, ready=lambda line: print(line, flush=True),
          **given),
      verbose=FLAGS.verbose, flag_names=_OPTIONAL + ('reverb_host',),
      quit_message='Quit without a final checkpoint; the last completed '
      'checkpoint is resumed on the next start.')
  if exit_code is not None:
    return exit_code
  print(f'Stopped; final checkpoint: {path}', file=sys.stderr)
  return 0


def _refuse_gin_reverb_host(reverb_host):
  """Fails if gin binds `serve.reverb_host` to another address than the
  flag's: the process was started for the flag's before gin was read.

  Raises:
    app.UsageError: names both.
  """
  import gin  # pylint: disable=g-import-not-at-top
  try:
    bound = gin.query_parameter('serve.reverb_host')
  except ValueError:  # Not bound.
    return
  if bound != reverb_host:
    raise app.UsageError(
        f'gin binds serve.reverb_host={bound!r}, but --reverb_host is '
        f'{reverb_host!r}; set the address with --reverb_host (the binary '
        'binds it before reading gin).')


def run():
  """Console-script entry point (`smart-replay-serve`)."""
  binary.run(main)


if __name__ == '__main__':
  run()
