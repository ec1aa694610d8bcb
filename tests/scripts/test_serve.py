"""`smart-replay-serve`: the binary's address line, exit codes and errors,
its metrics endpoint, and the address Reverb's port listens on
(--reverb_host).

Reverb's port listens on 127.0.0.1 by default: the kernel's listening
sockets say so, and a connect to another address of this machine fails, as
another Unix user too (who can still reach 127.0.0.1: loopback keeps other
machines out, not other users; skipped unless root, see tests/other_user.py);
--reverb_host=0.0.0.0 listens everywhere without the bind-address library;
a bad --reverb_host, or one address where the library cannot be built, is
an error saying what to do.

Serving real actors, SIGTERM and kill -9 are in
tests/smart_replay/test_remote.py.
"""

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import reverb

from smart_replay.control import protocol
from smart_replay.ops import bind_address
from smart_replay.utils import listening
from smart_replay.spec import specs
from tests import other_user
from tests import testing
from tests.smart_replay.remote import remote_workers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable),
                              'smart-replay-serve')
# What TensorFlow and Reverb print at INFO level when nothing filters them.
NATIVE_INFO = re.compile(r'^(\d{4}-\d\d-\d\d [\d:.]+: [IE] |\[reverb/cc/)',
                         re.MULTILINE)
# Under Bazel the test's PATH may be minimal: `ip` is in sbin.
MAX_PER_PEER = protocol.MAX_CONNECTIONS_PER_PEER
_TOOL_PATH = os.pathsep.join([os.environ.get('PATH', ''), '/usr/sbin', '/sbin',
                              '/usr/bin', '/bin'])
# Run as another Unix user: a Reverb client's call to each address, as JSON
# ({address: 'served' or the error's type}).
_OTHER_CLIENT = '''
import json
import reverb
out = {{}}
for address in {addresses!r}:
  try:
    reverb.Client(address).server_info(timeout=10)
    out[address] = 'served'
  except Exception as e:  # pylint: disable=broad-except
    out[address] = type(e).__name__
print(json.dumps(out))
'''

# Run as another Unix user: opens `count` TCP connections to the control
# port, prints how many the server closed at once, holds the others until a
# line comes on stdin.
_OTHER_FLOOD = '''
import json, socket, sys, time
sockets = [socket.create_connection(('127.0.0.1', {port}), timeout=30)
           for _ in range({count})]
closed, deadline = 0, time.monotonic() + 3
for s in sockets:
  s.settimeout(max(0.01, deadline - time.monotonic()))
  try:
    closed += s.recv(1) == b''
  except socket.timeout:
    pass
  except ConnectionResetError:
    closed += 1
print(json.dumps({{'closed': closed}}), flush=True)
sys.stdin.readline()
'''


def _serve(*args, timeout=120):
  return subprocess.run([CONSOLE_SCRIPT, *args], capture_output=True,
                        text=True, timeout=timeout, cwd=ROOT)


def test_bad_spec_file_and_bad_capacity_exit_2(tmp_path):
  missing = _serve(f'--spec_file={tmp_path}/none.pbtxt',
                   f'--checkpoint_dir={tmp_path}/buffer')
  assert missing.returncode == 2
  assert 'none.pbtxt' in missing.stderr and 'save_spec' in missing.stderr
  spec_file = str(tmp_path / 'spec.pbtxt')
  specs.save_spec(spec_file, testing.collect_data_spec(testing.make_env()))
  zero = _serve(f'--spec_file={spec_file}', f'--checkpoint_dir={tmp_path}/b',
                '--capacity=0')
  assert zero.returncode != 0
  assert '--capacity' in zero.stderr and '0' in zero.stderr


def test_serves_with_the_config_and_stops_on_sigint(tmp_path):
  """--gin_file=configs/serve.gin; `--metrics-port=0` answers a scrape with
  the reader token (and only with it); SIGINT stops it with a final
  checkpoint; TensorFlow's and Reverb's INFO lines are not shown."""
  spec_file = str(tmp_path / 'spec.pbtxt')
  specs.save_spec(spec_file, testing.collect_data_spec(testing.make_env()))
  process = subprocess.Popen(
      [CONSOLE_SCRIPT, f'--spec_file={spec_file}',
       f'--checkpoint_dir={tmp_path}/buffer',
       f'--port={remote_workers.free_port_pair()}',
       '--gin_file=configs/serve.gin', '--metrics-port=0'],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
  try:
    line = process.stdout.readline()
    assert line.startswith("Serving ['experience'] at "), line
    url = re.search(r'Metrics at (http://\S+/metrics)', line).group(1)
    # The metrics endpoint takes the reader token (the token file's first
    # line; its server's certificate follows).
    token = (tmp_path / 'buffer' / 'reader.token').read_text().split()[0]
    with pytest.raises(urllib.error.HTTPError, match='401'):
      urllib.request.urlopen(url, timeout=30)  # The token is required.
    request = urllib.request.Request(
        url, headers={'Authorization': f'Bearer {token}'})
    with urllib.request.urlopen(request, timeout=30) as response:
      text = response.read().decode()
    assert 'smart_replay_up 1.0' in text
    assert 'smart_replay_table_items{table="experience"} 0.0' in text
    assert 'smart_replay_checkpoint_failing 0.0' in text
  finally:
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
  assert process.returncode == 0, err[-2000:]
  assert 'SECURITY' in err and 'listens on 127.0.0.1 only' in err
  assert 'Stopped; final checkpoint:' in err
  assert os.path.isdir(os.path.join(tmp_path, 'buffer', 'checkpoints',
                                    'ckpt-000001'))
  assert not NATIVE_INFO.search(out + err), err


def _squat_on_a_control_port(attempts=20):
  """Returns `(P, a socket listening on P + 1)` for a free pair P.

  A pair found free may be taken before the squatter binds it (another test
  running beside this one, or a connection in TIME_WAIT): then another pair.
  """
  for _ in range(attempts):
    port = remote_workers.free_port_pair()
    squatter = socket.socket()
    try:
      squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      squatter.bind(('127.0.0.1', port + 1))
      squatter.listen()
      return port, squatter
    except OSError:
      squatter.close()
  raise AssertionError(f'no free port pair to squat on in {attempts} tries')


def test_a_taken_control_port_is_named_before_the_buffer_opens(tmp_path):
  """--port=P with P + 1 taken exits 2 naming --control_port; with
  --control_port=Q it serves: without --gin_file, the shipped serve.gin,
  whose --capacity and --sequence_length flags override it, like
  smart-replay-populate's."""
  spec_file = str(tmp_path / 'spec.pbtxt')
  specs.save_spec(spec_file, testing.collect_data_spec(testing.make_env()))
  port, squatter = _squat_on_a_control_port()
  with squatter:
    taken = _serve(f'--spec_file={spec_file}',
                   f'--checkpoint_dir={tmp_path}/buffer', f'--port={port}')
    assert taken.returncode == 2, taken.stderr[-2000:]
    assert (f"the control port, Reverb's port {port} + 1, {port + 1} is in "
            'use by another process') in taken.stderr
    assert '--control_port' in taken.stderr
    assert not os.path.exists(os.path.join(tmp_path, 'buffer', 'checkpoints'))
    control_port = remote_workers.free_port_pair()
    process = subprocess.Popen(  # Outside the repository: no configs/ here.
        [CONSOLE_SCRIPT, f'--spec_file={spec_file}',
         f'--checkpoint_dir={tmp_path}/buffer', f'--port={port}',
         f'--control_port={control_port}', '--capacity=500',
         '--sequence_length=3'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path)
    line = process.stdout.readline()
    assert line.startswith("Serving ['experience'] at "), line
    assert f'control at 127.0.0.1:{control_port})' in line, line
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
  with open(os.path.join(tmp_path, 'buffer', 'checkpoints', 'ckpt-000001',
                         'manifest.json')) as f:
    manifest = json.load(f)
  assert (manifest['capacity'], manifest['sequence_length'],
          manifest['stride_length']) == (500, 3, 1)
  assert manifest['tables'][0]['remover'] == 'fifo'  # From serve.gin.


def _spec_file(tmp_path):
  spec_file = str(tmp_path / 'spec.pbtxt')
  if not os.path.exists(spec_file):
    specs.save_spec(spec_file, testing.collect_data_spec(testing.make_env()))
  return spec_file


def _start(tmp_path, port, *flags, env=None):
  """Starts the binary; returns the process and its ready line."""
  process = subprocess.Popen(
      [CONSOLE_SCRIPT, f'--spec_file={_spec_file(tmp_path)}',
       f'--checkpoint_dir={tmp_path}/buffer', f'--port={port}', *flags],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
      env=env)
  return process, process.stdout.readline()


def _stop(process):
  process.send_signal(signal.SIGINT)
  _, err = process.communicate(timeout=120)
  assert process.returncode == 0, err[-3000:]
  return err


def _external_addresses():
  """This machine's global IPv4 addresses (`ip -o -4 addr`)."""
  ip = shutil.which('ip', path=_TOOL_PATH)
  if ip is None:
    return []
  out = subprocess.run([ip, '-o', '-4', 'addr', 'show', 'scope', 'global'],
                       capture_output=True, text=True, timeout=30).stdout
  return re.findall(r'\sinet (\d+\.\d+\.\d+\.\d+)/', out)


def _connects(host, port):
  """Whether a TCP connect to host:port succeeds; (connected, errno name)."""
  try:
    with socket.create_connection((host, port), timeout=10):
      return True, None
  except OSError as e:
    return False, type(e).__name__


def _closed_at_once(host, port, count):
  """Opens `count` TCP connections to host:port at once (sending nothing);
  returns how many the server closed within a few seconds, before its TLS
  handshake timeout (10 s) closes the others; then closes them all."""
  sockets = [socket.create_connection((host, port), timeout=30)
             for _ in range(count)]
  try:
    closed, deadline = 0, time.monotonic() + 3
    for s in sockets:
      s.settimeout(max(0.01, deadline - time.monotonic()))
      try:
        closed += s.recv(1) == b''
      except socket.timeout:
        pass
      except ConnectionResetError:
        closed += 1
    return closed
  finally:
    for s in sockets:
      s.close()


def _modes(folder):
  """{path: permission bits} of everything under `folder`."""
  found = {}
  for where, folders, files in os.walk(folder):
    for name in folders + files:
      path = os.path.join(where, name)
      found[path] = stat.S_IMODE(os.lstat(path).st_mode)
  return found


def test_reverb_listens_on_loopback_only_by_default(tmp_path):
  port = remote_workers.free_port_pair()
  process, line = _start(tmp_path, port)
  try:
    assert line.startswith(
        f"Serving ['experience'] at 127.0.0.1:{port} (Reverb, this machine "
        f'only; control at 127.0.0.1:{port + 1}). '), line
    assert 'localhost' not in line
    # What the kernel says: loopback only.
    assert listening.addresses(port, own=False) == ['127.0.0.1']
    external = _external_addresses()
    for address in external:  # Another address of this machine: refused.
      assert _connects(address, port) == (False, 'ConnectionRefusedError')
    assert _connects('127.0.0.1', port)[0]
    # One peer (this user) holds at most MAX_PER_PEER control connections.
    assert _closed_at_once('127.0.0.1', port + 1, MAX_PER_PEER + 2) == 2
    # Closed, they free the cap: a client's control calls go through.
    manager, _ = remote_workers.client(
        f'127.0.0.1:{port}',
        control_token_file=str(tmp_path / 'buffer' / 'control.token'))
    with manager:
      assert manager.stats()['tables']['experience']['items'] == 0
  finally:
    err = _stop(process)  # A final checkpoint: its own client got through.
  assert 'Reverb (port %d) listens on 127.0.0.1 only' % port in err, err
  assert re.search(rf'control service listens on 127\.0\.0\.1:{port + 1} '
                   r'\(operator and reader tokens, TLS \(own certificate '
                   rf'[^)]*\); at most {MAX_PER_PEER} connections per peer\)',
                   err), err
  # umask 077: nothing the server made is open to group or others.
  modes = _modes(tmp_path / 'buffer')
  assert modes and all(mode & 0o077 == 0 for mode in modes.values()), modes
  if not external:
    pytest.skip('this machine has no global IPv4 address to connect to')


def test_another_user_cannot_reach_the_default_port(tmp_path):
  """Another Unix user's Reverb client is served nowhere: not through another
  address of this machine (loopback only), not at 127.0.0.1 (the server
  closes connections of other users' sockets); the owner's client is, and
  the status line counts the refusals."""
  other = other_user.require()
  port = remote_workers.free_port_pair()
  process, line = _start(tmp_path, port,
                         '--gin_bindings=ReplayServer.log_every_s=1')
  read = []
  try:
    assert line.startswith("Serving ['experience'] at 127.0.0.1:"), line
    addresses = ([f'{a}:{port}' for a in _external_addresses()] +
                 [f'127.0.0.1:{port}'])
    done = other.run_python(_OTHER_CLIENT.format(addresses=addresses),
                            timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got == {a: 'DeadlineExceededError' for a in addresses}, got
    mine = reverb.Client(f'127.0.0.1:{port}').server_info(timeout=30)
    assert 'experience' in mine
    # The other user's connections to the control port count against its
    # own cap, not this user's: while it holds all it may, calls go through.
    flood = other.popen_python(
        _OTHER_FLOOD.format(port=port + 1, count=MAX_PER_PEER + 8),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
      line = flood.stdout.readline()
      assert json.loads(line) == {'closed': 8}, line
      manager, _ = remote_workers.client(
          f'127.0.0.1:{port}',
          control_token_file=str(tmp_path / 'buffer' / 'control.token'))
      with manager:
        assert manager.stats()['tables']['experience']['items'] == 0
    finally:
      flood.communicate('done\n', timeout=60)
    # A status line a second: the next one counts what was refused.
    assert _next_line(process.stderr, r'refused [\d,]+ connection\(s\) of '
                      'other users of this machine to Reverb', 120, read), (
                          'no status line counted the refused connections:\n'
                          + ''.join(read)[-3000:])
  finally:
    err = ''.join(read) + _stop(process)
  assert 'connections from other users of this machine are refused' in err


def _next_line(stream, pattern, timeout_s, read):
  """The first line of `stream` matching `pattern` within `timeout_s`, or
  None (the process must write lines meanwhile, e.g. status lines); every
  line read is appended to `read`."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    line = stream.readline()
    read.append(line)
    if not line:
      return None
    if re.search(pattern, line):
      return line
  return None


def test_every_interface_needs_no_bind_address_library(tmp_path):
  """--reverb_host=0.0.0.0 listens on every interface (Reverb's '::') and
  starts where the library cannot be built (no compiler, an empty cache)."""
  port = remote_workers.free_port_pair()
  cache = tmp_path / 'cache'
  cache.mkdir(mode=0o700)
  env = dict(os.environ, CXX='no-such-cxx',
             SMART_REPLAY_CACHE_DIR=str(cache))
  process, line = _start(tmp_path, port, '--reverb_host=0.0.0.0', env=env)
  try:
    assert f'(Reverb, every interface; control at 127.0.0.1:{port + 1}); ' \
        f'on this machine: 127.0.0.1:{port}. ' in line, line
    assert listening.addresses(port, own=False) == ['::']
    for address in ['127.0.0.1'] + _external_addresses():
      assert _connects(address, port)[0], address
  finally:
    err = _stop(process)
  assert 'listens on ALL network interfaces' in err
  assert os.listdir(cache) == []  # Nothing was built.


def test_one_address_without_a_compiler_fails_with_an_install_hint(tmp_path):
  if os.path.exists(bind_address.prebuilt_path()):
    pytest.skip('the bind-address library is prebuilt here (Bazel)')
  cache = tmp_path / 'cache'
  cache.mkdir(mode=0o700)
  env = dict(os.environ, CXX='no-such-cxx',
             SMART_REPLAY_CACHE_DIR=str(cache))
  started = time.monotonic()
  done = subprocess.run(
      [CONSOLE_SCRIPT, f'--spec_file={_spec_file(tmp_path)}',
       f'--checkpoint_dir={tmp_path}/buffer',
       f'--port={remote_workers.free_port_pair()}'],
      capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
  assert done.returncode == 2, done.stderr[-3000:]
  assert "no C++ compiler: 'no-such-cxx' is not on PATH" in done.stderr
  assert 'apt-get install g++' in done.stderr
  assert done.stdout == ''  # Never served.
  assert not os.path.exists(tmp_path / 'buffer')
  assert time.monotonic() - started < 60  # Before TensorFlow loads.


def test_a_bad_reverb_host_is_named(tmp_path):
  for host, says in (('localhost', "--reverb_host='localhost' is not an IP "
                                   'address'),
                     ('203.0.113.254', "--reverb_host='203.0.113.254' is not"
                                       ' an address of this machine')):
    done = _serve(f'--spec_file={_spec_file(tmp_path)}',
                  f'--checkpoint_dir={tmp_path}/buffer',
                  f'--reverb_host={host}')
    assert done.returncode == 2, done.stderr[-3000:]
    assert says in done.stderr, done.stderr[-3000:]
  assert not os.path.exists(tmp_path / 'buffer')
  # Gin cannot move it: the binary binds the flag's address before gin.
  done = _serve(f'--spec_file={_spec_file(tmp_path)}',
                f'--checkpoint_dir={tmp_path}/buffer',
                f'--port={remote_workers.free_port_pair()}',
                "--gin_bindings=serve.reverb_host='0.0.0.0'")
  assert done.returncode == 2, done.stderr[-3000:]
  assert ("gin binds serve.reverb_host='0.0.0.0', but --reverb_host is "
          "'127.0.0.1'") in done.stderr, done.stderr[-3000:]
