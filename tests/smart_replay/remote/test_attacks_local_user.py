"""The second review's token thefts, replayed as another Unix user.

`../shared/notes/security-review-2.md`, H1 and M2: another user of the
machine listens where a client dials the control service (`[::1]` beside
the server's `127.0.0.1`, or the port of a server that restarts) and logs
the metadata of every call, to steal the token. Here a real second user
(`tests/other_user`, made when the tests run as root; skipped otherwise)
runs that listener; the project's clients must never hand it a token: they
dial 127.0.0.1, and send a token only over TLS to the certificate their
token file carries.
"""

import subprocess
import time

import pytest

import smart_replay
from smart_replay.control import access as control_access
from smart_replay.control import client
from smart_replay.control import credentials
from smart_replay.remote import replay_server as serve
from tests import other_user
from tests.smart_replay.remote import remote_workers

# A plain gRPC server that prints the metadata of every call it gets (the
# review's probe, without the relay).
LISTENER = '''
import concurrent.futures, sys
import grpc

class Logger(grpc.GenericRpcHandler):
  def service(self, details):
    print('CALL', details.method, list(details.invocation_metadata),
          flush=True)
    return grpc.unary_unary_rpc_method_handler(lambda request, context: b'{}')

server = grpc.server(concurrent.futures.ThreadPoolExecutor(4),
                     options=[('grpc.so_reuseport', 0)])
server.add_generic_rpc_handlers([Logger()])
if not server.add_insecure_port(ADDRESS):
  print('CANNOT LISTEN', flush=True)
  sys.exit(1)
server.start()
print('LISTENING', flush=True)
sys.stdin.read()  # Until the test closes it.
server.stop(0)
'''


def _listen(user, address):
  """The other user's listener on `address`, once it listens."""
  process = user.popen_python(LISTENER.replace('ADDRESS', repr(address)),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
  line = process.stdout.readline()  # Blocks until it listens or fails.
  assert line.startswith('LISTENING'), line
  return process


def _loot(process):
  """What the listener printed, once stopped (closing its input stops it;
  killing `runuser` would leave its child)."""
  out, _ = process.communicate('', timeout=60)
  return out


@pytest.fixture
def user():
  return other_user.require()


def _server(tmp_path, data_spec, port):
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec, capacity=100, sequence_length=2,
      checkpoint_dir=str(tmp_path / 'buffer'), port=port)
  return serve.ReplayServer(manager, control_port=port + 1,
                            access=control_access.ControlAccess()).start()


def test_a_listener_on_ipv6_loopback_gets_no_token(user, tmp_path, data_spec):
  """H1: the other user listens on `[::1]:P+1`; a client of `localhost:P`
  connects (to 127.0.0.1) and the listener sees no call at all."""
  port = remote_workers.free_port_pair()
  server = _server(tmp_path, data_spec, port)
  listener = _listen(user, f'[::1]:{port + 1}')
  try:
    client = smart_replay.ReplayBufferManager(
        data_spec=data_spec, server_address=f'localhost:{port}',
        control_token_file=server.token_file, sample_timeout_s=10.0,
        write_timeout_s=10.0)
    client.connect()
    client.close()
  finally:
    loot = _loot(listener)
    server.close(final_checkpoint=False)
  assert 'CALL' not in loot and 'Bearer' not in loot, loot


def test_a_listener_on_a_restarting_servers_port_gets_no_token(
    user, tmp_path, data_spec):
  """M2: the server stops; the other user binds its control port at once; a
  client calling on (waiting for the server, as a reconnecting client does)
  fails with a clear error, and the listener gets no token."""
  port = remote_workers.free_port_pair()
  server = _server(tmp_path, data_spec, port)
  token_file = server.token_file
  server.close(final_checkpoint=False)
  listener = _listen(user, f'127.0.0.1:{port + 1}')
  try:
    control = client.ControlClient(
        f'127.0.0.1:{port + 1}',
        credentials=credentials.ClientCredentials.resolve(
            token_file=token_file, environ={}))
    started = time.monotonic()
    with pytest.raises(smart_replay.AuthenticationError,
                       match='did not prove it is the buffer\'s server'):
      control.call('info', timeout_s=5)
    assert time.monotonic() - started < 30
    control.close()
  finally:
    loot = _loot(listener)
  with open(token_file) as f:
    token = f.readline().strip()
  assert 'Bearer' not in loot and token not in loot, loot
