"""The bind-address library (`smart_replay.ops.bind_address`): the addresses
it accepts, what a process started with it binds and connects to, the
restart that starts a process with it, the check of what the kernel says,
and no fallback when it cannot be built.

Processes started with the library run plain sockets (no TensorFlow):
`bind_address.c` rewrites libc's bind() and connect(), whoever calls them.
"""

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from smart_replay.ops import bind_address
from smart_replay.utils import listening
from smart_replay.utils import ports
from tests import testing

LOOPBACK = bind_address.LOOPBACK

# Run with the library preloaded: binds [::]:PORT (rewritten) and [::]:0
# (another port, untouched), connects to ::1:PORT (redirected), and reports
# what it sees as JSON.
_PRELOADED = r'''
import json, os, socket, sys
from smart_replay.ops import bind_address
from smart_replay.utils import listening
port = int(sys.argv[1])
out = {'env': {k: os.environ.get(k) for k in (
           'LD_PRELOAD', bind_address.ADDRESS_ENV,
           bind_address.PRELOAD_WAS_ENV)},
       'in_force': bind_address.in_force(),
       'error': bind_address.load_error()}
listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
listener.bind(('::', port))
listener.listen()
other = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
other.bind(('::', 0))
other.listen()
out['listening'] = listening.addresses(port)
out['other'] = listening.addresses(other.getsockname()[1])
out['rewrites'] = bind_address.rewritten_binds()
client = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
client.settimeout(10)
try:
  client.connect(('::1', port))
  out['peer'] = client.getpeername()[0]
except OSError as e:
  out['peer'] = str(e)
print(json.dumps(out))
'''

# Restarts itself with the library (`ensure_in_force`); prints its process
# id before, and what is in force after.
_RESTARTING = r'''
import json, os, sys
from smart_replay.ops import bind_address
print('started', os.getpid(), flush=True)
bind_address.ensure_in_force(int(sys.argv[1]), sys.argv[2])
print(json.dumps({'pid': os.getpid(), 'in_force': bind_address.in_force(),
                  'marker': os.environ.get(bind_address.RESTARTED_ENV),
                  'preload': os.environ.get('LD_PRELOAD')}), flush=True)
'''


def _run(code, *args, env=None):
  done = subprocess.run([sys.executable, '-c', code, *map(str, args)],
                        capture_output=True, text=True, timeout=120,
                        cwd=testing.ROOT, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  return done


@pytest.mark.unit
@pytest.mark.parametrize('given, canonical', [
    ('127.0.0.1', '127.0.0.1'), ('::1', '::1'), ('0.0.0.0', '0.0.0.0'),
    ('::', '::'), ('::ffff:127.0.0.1', '127.0.0.1'),
    ('0:0:0:0:0:0:0:1', '::1')])
def test_addresses_of_this_machine_are_accepted(given, canonical):
  assert bind_address.check_host(given) == canonical


@pytest.mark.unit
@pytest.mark.parametrize('given, says', [
    ('localhost', "reverb_host='localhost' is not an IP address"),
    ('', "reverb_host='' is not an IP address"),
    (None, 'reverb_host=None is not an IP address string'),
    ('192.0.2.300', "reverb_host='192.0.2.300' is not an IP address"),
    ('224.0.0.1', 'is a multicast address'),
    ('fe80::1', 'link-local address, which needs an interface scope'),
    # TEST-NET-3, never on a machine's own interfaces.
    ('203.0.113.254', "reverb_host='203.0.113.254' is not an address of "
                      'this machine')])
def test_bad_addresses_are_refused_naming_them(given, says):
  with pytest.raises(ValueError, match=re.escape(says)):
    bind_address.check_host(given)


def test_a_preloaded_process_binds_and_connects_to_the_address():
  library = bind_address.library_path()
  port = ports.free_port_pair()
  env = bind_address.preload_environment(
      port, LOOPBACK, library, dict(os.environ, LD_PRELOAD='libm.so.6'))
  assert env['LD_PRELOAD'] == f'{library} libm.so.6'
  got = json.loads(_run(_PRELOADED, port, env=env).stdout)
  assert got['in_force'] == [port, LOOPBACK] and got['error'] is None
  # What its children inherit: the variable gone, LD_PRELOAD as before.
  assert got['env'] == {'LD_PRELOAD': 'libm.so.6',
                        bind_address.ADDRESS_ENV: None,
                        bind_address.PRELOAD_WAS_ENV: None}
  assert got['listening'] == [LOOPBACK]  # [::]:PORT became 127.0.0.1:PORT.
  assert got['other'] == ['::']  # Another port is left alone.
  assert got['rewrites'] == 1
  assert got['peer'] == f'::ffff:{LOOPBACK}'  # ::1 went to 127.0.0.1.


def test_a_malformed_variable_rewrites_nothing_and_says_why():
  port = ports.free_port_pair()
  env = dict(os.environ, LD_PRELOAD=bind_address.library_path(),
             **{bind_address.ADDRESS_ENV: f'{port};{LOOPBACK}'})
  got = json.loads(_run(_PRELOADED, port, env=env).stdout)
  assert got['in_force'] is None
  assert 'is not PORT,ADDRESS' in got['error'], got
  assert got['listening'] == ['::'] and got['rewrites'] == 0
  assert got['env']['LD_PRELOAD'] is None  # It was not set before.


# Run with the library preloaded and a cap of 2 connections per peer on a
# second port: this process (one peer) opens 3 connections to it, accepts
# what the library lets through, closes one and opens a 4th; reports as JSON.
_CAPPED = r'''
import json, socket, sys
from smart_replay.ops import bind_address
port, capped = int(sys.argv[1]), int(sys.argv[2])
listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
listener.bind(('::', capped))
listener.listen()
listener.settimeout(2)

def accept_all():
  got = []
  while True:
    try:
      got.append(listener.accept()[0])
    except socket.timeout:
      return got

def closed(client):
  client.settimeout(5)
  try:
    return client.recv(1) == b''
  except (socket.timeout, ConnectionResetError) as e:
    return isinstance(e, ConnectionResetError)

clients = [socket.create_connection(('::1', capped)) for _ in range(3)]
accepted = accept_all()
out = {'cap': bind_address.connection_cap(), 'accepted': len(accepted),
       'closed': [closed(c) for c in clients[2:]],
       'refused': bind_address.refused_over_cap()}
accepted[0].close()
clients.append(socket.create_connection(('::1', capped)))
out['after_a_close'] = len(accept_all())
print(json.dumps(out))
'''


def test_a_capped_port_closes_a_peers_connections_over_the_cap():
  library = bind_address.library_path()
  port, capped = ports.free_port_pair(), ports.free_port_pair()
  env = bind_address.preload_environment(port, LOOPBACK, library, os.environ,
                                         connection_cap=(capped, 2))
  assert env[bind_address.CAP_ENV] == f'{capped},2'
  got = json.loads(_run(_CAPPED, port, capped, env=env).stdout)
  assert got == {'cap': [capped, 2], 'accepted': 2, 'closed': [True],
                 'refused': 1, 'after_a_close': 1}, got


@pytest.mark.parametrize('cap', ['0,2', '80', '80,0', '80,2x', '80,99999'])
def test_a_malformed_cap_leaves_nothing_in_force_and_says_why(cap):
  port = ports.free_port_pair()
  env = dict(os.environ, LD_PRELOAD=bind_address.library_path(),
             **{bind_address.ADDRESS_ENV: f'{port},{LOOPBACK}',
                bind_address.CAP_ENV: cap})
  got = json.loads(_run(_PRELOADED, port, env=env).stdout)
  assert got['in_force'] is None
  assert f'{bind_address.CAP_ENV}={cap} is not PORT,N' in got['error'], got
  assert got['listening'] == ['::'] and got['rewrites'] == 0


def test_ensure_in_force_restarts_the_process_with_the_library():
  port = ports.free_port_pair()
  done = _run(_RESTARTING, port, LOOPBACK,
              env={k: v for k, v in os.environ.items() if k != 'LD_PRELOAD'})
  started = re.findall(r'^started (\d+)$', done.stdout, re.M)
  assert len(started) == 2, done.stdout  # Once, then once restarted ...
  got = json.loads(done.stdout.splitlines()[-1])
  assert got['pid'] == int(started[0]) == int(started[1])  # ... in place.
  assert got['in_force'] == [port, LOOPBACK]
  assert got['marker'] is None and got['preload'] is None  # Children: clean.
  # Every interface needs no library: no restart.
  done = _run(_RESTARTING, port, '0.0.0.0')
  assert len(re.findall('^started', done.stdout, re.M)) == 1, done.stdout


def test_a_restart_that_did_not_load_the_library_fails_instead_of_looping():
  port = ports.free_port_pair()
  env = dict(os.environ, **{bind_address.RESTARTED_ENV: f'{port},{LOOPBACK}'})
  env.pop('LD_PRELOAD', None)
  done = subprocess.run([sys.executable, '-c', _RESTARTING, str(port),
                         LOOPBACK], capture_output=True, text=True,
                        timeout=120, cwd=testing.ROOT, env=env)
  assert done.returncode != 0
  assert len(re.findall('^started', done.stdout, re.M)) == 1, done.stdout
  assert ('BindAddressError: this process was restarted with the '
          'bind-address library to bind port') in done.stderr, done.stderr


def test_check_listening_names_where_the_port_listens():
  with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as everywhere:
    everywhere.bind(('::', 0))
    everywhere.listen()
    port = everywhere.getsockname()[1]
    assert bind_address.check_listening(port, '0.0.0.0') == ['::']
    assert bind_address.check_listening(port, '::') == ['::']
    with pytest.raises(bind_address.BindAddressError, match=re.escape(
        f"Reverb's port {port} listens on ['::'] in this process, not on "
        f'{LOOPBACK} as asked (reverb_host={LOOPBACK}); refusing to serve.')):
      bind_address.check_listening(port, LOOPBACK)
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as loopback:
    loopback.bind((LOOPBACK, 0))
    loopback.listen()
    port = loopback.getsockname()[1]
    assert bind_address.check_listening(port, LOOPBACK) == [LOOPBACK]
    with pytest.raises(bind_address.BindAddressError, match='not on 0.0.0.0'):
      bind_address.check_listening(port, '0.0.0.0')
  with pytest.raises(bind_address.BindAddressError, match='no address'):
    bind_address.check_listening(port, LOOPBACK)  # Closed.


def test_without_a_compiler_it_fails_with_what_to_install(tmp_path,
                                                          monkeypatch):
  cache = tmp_path / 'cache'
  cache.mkdir(mode=0o700)
  monkeypatch.setenv('SMART_REPLAY_CACHE_DIR', str(cache))
  monkeypatch.setenv('CXX', 'no-such-cxx')
  monkeypatch.setattr(bind_address, 'prebuilt_path',
                      lambda: str(tmp_path / 'none.so'))
  with pytest.raises(bind_address.BindAddressError) as raised:
    bind_address.library_path()
  message = str(raised.value)
  assert "no C++ compiler: 'no-such-cxx' is not on PATH" in message
  assert 'apt-get install g++' in message
  with pytest.raises(bind_address.BindAddressError):
    bind_address.ensure_in_force(ports.free_port_pair(), LOOPBACK)
  # Every interface needs no library.
  bind_address.ensure_in_force(ports.free_port_pair(), '0.0.0.0')


def test_the_library_is_built_once_into_the_cache_with_its_key(
    tmp_path, monkeypatch):
  cache = tmp_path / 'cache'
  cache.mkdir(mode=0o700)
  monkeypatch.setenv('SMART_REPLAY_CACHE_DIR', str(cache))
  monkeypatch.setattr(bind_address, 'prebuilt_path',
                      lambda: str(tmp_path / 'none.so'))
  path = bind_address.library_path()
  key = bind_address.library_key()
  assert path == str(cache / 'ops' / key / bind_address.LIBRARY_NAME)
  assert key.startswith('bind-') and len(key) == len('bind-') + 16
  with open(path + '.key') as f:
    assert f.read().strip() == key
  mtime = os.stat(path).st_mtime_ns
  assert bind_address.library_path() == path  # Reused.
  assert os.stat(path).st_mtime_ns == mtime


def test_serve_refuses_one_address_without_the_library(tmp_path):
  from smart_replay.remote import launch  # pylint: disable=g-import-not-at-top
  assert bind_address.in_force() is None  # pytest runs without it.
  with pytest.raises(bind_address.BindAddressError, match=re.escape(
      'binding port 47123 to 127.0.0.1 needs the process started with the '
      'bind-address library')) as raised:
    launch.serve(spec_file=str(tmp_path / 'spec.pbtxt'),
                 checkpoint_dir=str(tmp_path / 'buffer'), port=47123,
                 stop_requested=lambda: True)
  assert '--reverb_host=127.0.0.1' in str(raised.value)
  assert not os.path.exists(tmp_path / 'buffer')  # Nothing opened.
  with pytest.raises(ValueError, match="reverb_host='localhost'"):
    launch.serve(spec_file=str(tmp_path / 'spec.pbtxt'),
                 checkpoint_dir=str(tmp_path / 'buffer'), port=47123,
                 reverb_host='localhost', stop_requested=lambda: True)


def test_serve_refuses_to_go_on_when_the_port_listens_elsewhere(
    tmp_path, monkeypatch):
  """Without the library Reverb listens on '::': once started, serve()
  reads that from the kernel, closes the server and says so."""
  from smart_replay.remote import launch  # pylint: disable=g-import-not-at-top
  from smart_replay.spec import specs  # pylint: disable=g-import-not-at-top
  spec_file = str(tmp_path / 'spec.pbtxt')
  specs.save_spec(spec_file, testing.collect_data_spec(testing.make_env()))
  monkeypatch.setattr(bind_address, 'require', lambda port, host: None)
  port = ports.free_port_pair()
  lines = []
  with pytest.raises(bind_address.BindAddressError, match=re.escape(
      f"Reverb's port {port} listens on ['::'] in this process, not on "
      f'{LOOPBACK} as asked')):
    launch.serve(spec_file=spec_file, checkpoint_dir=str(tmp_path / 'buffer'),
                 port=port, capacity=100, sequence_length=2,
                 stop_requested=lambda: True, ready=lines.append)
  assert not lines  # Never said it serves.
  assert listening.addresses(port) == []  # Closed.
