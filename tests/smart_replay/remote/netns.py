"""Network namespaces as separate "hosts" on one machine, for tests.

`hosts` is a pytest fixture giving two network namespaces, a server host
and a client host, joined by a veth pair:

  server namespace  sr-server  10.254.77.1/24
  client namespace  sr-client  10.254.77.2/24 (and 10.254.77.3/24, a second
                                               client address)

with `lo` and both veth ends up, and no IPv6 addresses on the link
(`addrgenmode none`) unless a test adds its own (`Namespace.add_address`,
e.g. `SERVER_ADDRESS6`). The namespaces' names are unique to this run
(`srtest-<pid>-<n>-server`, `...-client`). Processes started in them run
with the interpreter of the tests (the project's venv python), the tests'
environment (less proxy variables: traffic must not go anywhere else) and
their output in a log file that failure messages quote. At teardown, even
when the test failed, every process started in the namespaces is killed,
then the link and the namespaces are deleted.

The tests skip, saying why, when not run as root, without `ip`, or when
`ip netns` / veth links are not usable here (e.g. an unprivileged
container). Traffic only ever goes to the addresses on this link or to
loopback inside a namespace: nothing here routes, forwards or resolves.

Every wait polls a condition against a deadline and says what it waited
for when it times out.
"""

import dataclasses
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pytest

from tests import testing

SERVER_ADDRESS = '10.254.77.1'
CLIENT_ADDRESS = '10.254.77.2'
OTHER_CLIENT_ADDRESS = '10.254.77.3'  # A second client address (firewall).
PREFIX_LENGTH = 24
# IPv6 (unique local) addresses a test may add to the link (`add_address`).
SERVER_ADDRESS6, OTHER_CLIENT_ADDRESS6 = 'fd77:254:77::1', 'fd77:254:77::3'
PREFIX_LENGTH6 = 64
SERVER_LINK, CLIENT_LINK = 'sr-server', 'sr-client'
NAME_PREFIX = 'srtest'
_STALE = re.compile(rf'^{NAME_PREFIX}-(\d+)-\d+-(server|client)$')
# Under Bazel the test's PATH may be minimal: `ip` and `nft` live in sbin.
_SBIN = ('/usr/sbin', '/sbin', '/usr/bin', '/bin')
_PROXY_VARIABLES = ('http_proxy', 'https_proxy', 'all_proxy', 'grpc_proxy',
                    'no_proxy')
_names = itertools.count()

# Run inside a namespace by `connect`: one TCP connect, the outcome as JSON.
_CONNECT = r'''
import errno, json, socket, sys
host, port, source, timeout_s = sys.argv[1], int(sys.argv[2]), sys.argv[3], \
    float(sys.argv[4])
family = socket.AF_INET6 if ':' in host else socket.AF_INET
s = socket.socket(family, socket.SOCK_STREAM)
s.settimeout(timeout_s)
try:
  if source:
    s.bind((source, 0))
  s.connect((host, port))
  out = {'connected': True, 'local': s.getsockname()[0]}
except socket.timeout:
  out = {'connected': False, 'error': 'timeout'}
except OSError as e:
  out = {'connected': False, 'error': errno.errorcode.get(e.errno, str(e))}
finally:
  s.close()
print(json.dumps(out))
'''

# Run inside a namespace by `listening`: its listening TCP sockets as JSON.
_LISTENING = r'''
import ipaddress, json, socket, struct
out = []
for name, family in (('/proc/net/tcp', socket.AF_INET),
                     ('/proc/net/tcp6', socket.AF_INET6)):
  try:
    lines = open(name).read().splitlines()[1:]
  except OSError:
    continue
  for line in lines:
    fields = line.split()
    if fields[3] != '0A':  # TCP_LISTEN
      continue
    address, port = fields[1].split(':')
    raw = bytes.fromhex(address)
    # The kernel prints each 32-bit word in host (little-endian) order.
    raw = b''.join(struct.pack('<I', struct.unpack('>I', raw[i:i + 4])[0])
                   for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(socket.inet_ntop(family, raw))
    address = getattr(address, 'ipv4_mapped', None) or address  # ::ffff:a.b.c.d
    out.append([str(address), int(port, 16)])
print(json.dumps(sorted(out)))
'''


def find_tool(name: str) -> Optional[str]:
  """The absolute path of a system tool, looking in sbin too."""
  path = os.pathsep.join([os.environ.get('PATH', ''), *_SBIN])
  return shutil.which(name, path=path)


def unusable_reason() -> Optional[str]:
  """Why namespaces cannot be made here (None if they may be)."""
  if not hasattr(os, 'geteuid') or os.geteuid() != 0:
    uid = os.geteuid() if hasattr(os, 'geteuid') else '?'
    return ('network-namespace tests need root (ip netns add, veth links); '
            f'running as uid {uid}')
  if find_tool('ip') is None:
    return ("network-namespace tests need iproute2's `ip` (not found on "
            f'PATH or in {", ".join(_SBIN)})')
  return None


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float,
               *, interval_s: float = 0.05,
               details: Callable[[], str] = lambda: '') -> None:
  """Polls `condition` until it holds; fails naming `what` after
  `timeout_s` (with `details()`, e.g. a log, appended)."""
  deadline = time.monotonic() + timeout_s
  while not condition():
    if time.monotonic() > deadline:
      more = details()
      raise AssertionError(f'timed out after {timeout_s} s waiting for {what}'
                           + (f'\n{more}' if more else ''))
    time.sleep(interval_s)


def child_environment(extra: Optional[Dict[str, str]] = None,
                      drop: Sequence[str] = ()) -> Dict[str, str]:
  """The tests' environment for a process in a namespace: passed through,
  without proxy variables (gRPC would send to a proxy), plus `extra`, less
  the variables named in `drop`."""
  env = {k: v for k, v in os.environ.items()
         if k.lower() not in _PROXY_VARIABLES and k not in drop}
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  env.update(extra or {})
  return env


def run(argv: Sequence[str], *, what: str, timeout_s: float = 30,
        check: bool = True, env: Optional[Dict[str, str]] = None
        ) -> subprocess.CompletedProcess:
  """Runs a command to completion, output captured; with `check`, a
  failure raises naming `what`, the command, its exit code and output."""
  try:
    done = subprocess.run(list(argv), capture_output=True, text=True,
                          timeout=timeout_s, env=env, check=False)
  except subprocess.TimeoutExpired as e:
    raise AssertionError(f'{what}: `{" ".join(argv)}` did not finish within '
                         f'{timeout_s} s; output: {e.stdout!r} '
                         f'{e.stderr!r}') from None
  if check and done.returncode != 0:
    raise AssertionError(f'{what}: `{" ".join(argv)}` exited '
                         f'{done.returncode}:\n{done.stdout}{done.stderr}')
  return done


class Process:
  """A long-running process in a namespace; its output goes to a log file.

  Started in its own session, so it and its children are one process group.
  """

  def __init__(self, argv: List[str], log_path: str, label: str,
               env: Dict[str, str], cwd: str):
    self.argv, self.log_path, self.label = argv, log_path, label
    self._log = open(log_path, 'w')
    self.popen = subprocess.Popen(argv, stdout=self._log,
                                  stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                  text=True, start_new_session=True)
    self.pid = self.popen.pid

  def log(self) -> str:
    with open(self.log_path, errors='replace') as f:
      return f.read()

  def describe(self, tail: int = 4000) -> str:
    """The command, its state and the end of its log, for messages."""
    code = self.popen.poll()
    state = 'running' if code is None else f'exited {code}'
    return (f'--- {self.label} ({state}): {" ".join(self.argv)}\n'
            f'--- log {self.log_path}:\n{self.log()[-tail:]}')

  def alive(self) -> bool:
    return self.popen.poll() is None

  def wait_for(self, text: str, timeout_s: float) -> None:
    """Waits until `text` is in the log; fails if the process exits first."""
    def seen():
      if text in self.log():
        return True
      if not self.alive():
        raise AssertionError(f'{self.label} exited before printing {text!r}:'
                             f'\n{self.describe()}')
      return False
    wait_until(seen, f'{text!r} in the log of {self.label}', timeout_s,
               interval_s=0.1, details=self.describe)

  def wait(self, timeout_s: float) -> int:
    """Waits for the exit; returns the exit code."""
    wait_until(lambda: not self.alive(), f'{self.label} to exit', timeout_s,
               interval_s=0.1, details=self.describe)
    self._log.close()
    return self.popen.returncode

  def signal(self, sig: int) -> None:
    """Sends `sig` to the process (if it is still running)."""
    if self.alive():
      os.kill(self.pid, sig)

  def kill(self) -> None:
    """SIGKILLs its process group and reaps it."""
    if self.alive():
      try:
        os.killpg(self.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    try:
      self.popen.wait(30)
    finally:
      self._log.close()


@dataclasses.dataclass
class Namespace:
  """One network namespace (one "host") and its veth end."""
  name: str
  link: str
  addresses: List[str]
  ip: str
  log_dir: str
  processes: List[Process] = dataclasses.field(default_factory=list)

  @property
  def address(self) -> str:
    return self.addresses[0]

  def command(self, argv: Sequence[str]) -> List[str]:
    """`argv` run inside this namespace (`ip netns exec`)."""
    return [self.ip, 'netns', 'exec', self.name, *argv]

  def run(self, argv: Sequence[str], *, what: str, timeout_s: float = 60,
          check: bool = True, env: Optional[Dict[str, str]] = None
          ) -> subprocess.CompletedProcess:
    """Runs `argv` to completion inside this namespace."""
    return run(self.command(argv), what=f'{what} (in {self.name})',
               timeout_s=timeout_s, check=check,
               env=child_environment() if env is None else env)

  def python_argv(self, *args: str) -> List[str]:
    """The tests' interpreter (the project's venv python) with `args`."""
    return [sys.executable, *args]

  def start(self, argv: Sequence[str], label: str, *,
            env: Optional[Dict[str, str]] = None) -> Process:
    """Starts a long-running `argv` inside this namespace, from the
    repository root, its output in `<log_dir>/<label>.log`."""
    path = os.path.join(self.log_dir,
                        re.sub(r'[^\w.-]', '_', label) + '.log')
    process = Process(self.command(argv), path, f'{label} in {self.name}',
                      child_environment() if env is None else env,
                      testing.ROOT)
    self.processes.append(process)
    return process

  def add_address(self, address: str) -> None:
    """Adds `address` ('a.b.c.d/len', or 'x::y/len' without duplicate
    address detection) to this namespace's end of the link."""
    run([self.ip, '-n', self.name, 'addr', 'add', address, 'dev', self.link]
        + (['nodad'] if ':' in address else []), what=f'adding {address}')
    self.addresses.append(address.split('/')[0])

  def connect(self, host: str, port: int, *, source: str = '',
              timeout_s: float = 2.0) -> Dict[str, object]:
    """One TCP connect from this namespace to `host:port` (IPv6 if `host`
    has a ':'; from `source` if given); returns `{'connected': True,
    'local': source address}` or `{'connected': False, 'error':
    'ECONNREFUSED' | 'timeout' | ...}`."""
    done = self.run(self.python_argv('-I', '-c', _CONNECT, host, str(port),
                                     source, str(timeout_s)),
                    what=f'a TCP connect to {host}:{port}',
                    timeout_s=timeout_s + 30)
    return json.loads(done.stdout)

  def listening(self) -> List[Tuple[str, int]]:
    """`[address, port]` of every listening TCP socket in this namespace
    (from its /proc/net/tcp and tcp6; '::' is every interface, an IPv4
    address mapped into IPv6 is given as IPv4)."""
    done = self.run(self.python_argv('-I', '-c', _LISTENING),
                    what='listing the listening sockets')
    return [tuple(pair) for pair in json.loads(done.stdout)]

  def pids(self) -> List[int]:
    """Every process in this namespace (`ip netns pids`)."""
    done = run([self.ip, 'netns', 'pids', self.name], check=False,
               what=f'listing the processes in {self.name}')
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 \
        else []

  def kill_all(self, timeout_s: float = 30) -> None:
    """Kills every process started here, then anything else left in the
    namespace (their children), and waits until it is empty."""
    for process in self.processes:
      process.kill()
    for pid in self.pids():
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    wait_until(lambda: not self.pids(), f'every process in {self.name} to '
               'exit', timeout_s, interval_s=0.1,
               details=lambda: f'left: {self.pids()}')


class Unusable(Exception):
  """Namespaces or veth links cannot be made here (the test skips)."""


class Hosts:
  """A server and a client namespace joined by a veth pair.

  Attributes:
    server: the server host (`SERVER_ADDRESS` on `SERVER_LINK`).
    client: the client host (`CLIENT_ADDRESS` and `OTHER_CLIENT_ADDRESS`
      on `CLIENT_LINK`).
    ip: the absolute path of `ip`.
  """

  def __init__(self, log_dir: str):
    self.ip = find_tool('ip')
    number = next(_names)
    base = f'{NAME_PREFIX}-{os.getpid()}-{number}'
    os.makedirs(log_dir, exist_ok=True)
    self.server = Namespace(f'{base}-server', SERVER_LINK, [SERVER_ADDRESS],
                            self.ip, log_dir)
    self.client = Namespace(f'{base}-client', CLIENT_LINK,
                            [CLIENT_ADDRESS, OTHER_CLIENT_ADDRESS], self.ip,
                            log_dir)
    self._created: List[Namespace] = []

  @property
  def namespaces(self) -> List[Namespace]:
    return [self.server, self.client]

  def _ip(self, *args: str, what: str, check: bool = True
          ) -> subprocess.CompletedProcess:
    return run([self.ip, *args], what=what, check=check)

  def create(self) -> None:
    """Makes the namespaces, the link and the addresses.

    Raises:
      Unusable: if `ip netns add` or the veth pair fails (names the command
        and its error).
      AssertionError: if a later step fails (names it).
      In both cases what was made is deleted first.
    """
    remove_stale(self.ip)
    try:
      self._create()
    except BaseException:
      self.destroy()
      raise

  def _create(self) -> None:
    """`create` without the clean-up."""
    for namespace in self.namespaces:
      done = self._ip('netns', 'add', namespace.name, check=False,
                      what='creating a namespace')
      if done.returncode != 0:
        raise Unusable(f'`ip netns add {namespace.name}` failed: '
                       f'{done.stderr.strip()}')
      self._created.append(namespace)
    # Each end is created inside its namespace (never on this host).
    done = self._ip('link', 'add', SERVER_LINK, 'netns', self.server.name,
                    'type', 'veth', 'peer', 'name', CLIENT_LINK, 'netns',
                    self.client.name, check=False,
                    what='creating the veth pair')
    if done.returncode != 0:
      raise Unusable(f'cannot create a veth pair: {done.stderr.strip()}')
    for namespace in self.namespaces:
      n = namespace.name
      self._ip('-n', n, 'link', 'set', 'lo', 'up', what='lo up')
      # No IPv6 link-local address: only the addresses below are on it.
      self._ip('-n', n, 'link', 'set', 'dev', namespace.link, 'addrgenmode',
               'none', what='no IPv6 addresses on the link')
      for address in namespace.addresses:
        self._ip('-n', n, 'addr', 'add', f'{address}/{PREFIX_LENGTH}', 'dev',
                 namespace.link, what=f'adding {address}')
      self._ip('-n', n, 'link', 'set', namespace.link, 'up',
               what=f'{namespace.link} up')
    wait_until(self._link_up, 'the veth link to be up in both namespaces', 10,
               details=self.describe)

  def _link_up(self) -> bool:
    for namespace in self.namespaces:
      done = self._ip('-n', namespace.name, '-o', 'link', 'show',
                      namespace.link, what='reading the link', check=False)
      if 'LOWER_UP' not in done.stdout:
        return False
    return True

  def describe(self) -> str:
    """Both namespaces' addresses, for messages."""
    return '\n'.join(
        self._ip('-n', n.name, '-br', 'addr', what='addresses',
                 check=False).stdout for n in self._created)

  def destroy(self) -> None:
    """Kills every process in the namespaces, deletes the link and the
    namespaces; raises at the end if any of it failed."""
    problems = []
    for namespace in list(self._created):
      try:
        namespace.kill_all()
      except AssertionError as e:
        problems.append(str(e))
    if self.server in self._created:
      # Deleting one end deletes the pair (it goes with its namespace too).
      self._ip('-n', self.server.name, 'link', 'del', SERVER_LINK,
               what='deleting the veth pair', check=False)
    for namespace in list(self._created):
      done = self._ip('netns', 'del', namespace.name, check=False,
                      what='deleting a namespace')
      if done.returncode != 0:
        problems.append(f'`ip netns del {namespace.name}`: '
                        f'{done.stderr.strip()}')
      else:
        self._created.remove(namespace)
    listed = self._ip('netns', 'list', what='listing namespaces',
                      check=False).stdout
    left = [n.name for n in self.namespaces if n.name in listed.split()]
    if left:
      problems.append(f'namespaces still present: {left}')
    if problems:
      raise AssertionError('cleaning up the test namespaces failed: '
                           + '; '.join(problems))


def remove_stale(ip: str) -> None:
  """Deletes namespaces this module made in runs whose process is gone
  (a test run killed before its teardown)."""
  listed = run([ip, 'netns', 'list'], what='listing namespaces',
               check=False).stdout
  for line in listed.splitlines():
    name = line.split()[0] if line.split() else ''
    match = _STALE.match(name)
    if not match or int(match.group(1)) == os.getpid():
      continue
    if os.path.exists(f'/proc/{match.group(1)}'):
      continue
    stale = Namespace(name, '', [], ip, '')
    try:
      stale.kill_all()
    except AssertionError:
      continue
    run([ip, 'netns', 'del', name], what='deleting a stale namespace',
        check=False)


@pytest.fixture
def hosts(tmp_path):
  """A server and a client "host" (network namespaces joined by a veth
  pair); skips, saying why, where they cannot be made. Everything is
  deleted at the end of the test, and every process in them killed."""
  reason = unusable_reason()
  if reason:
    pytest.skip(reason)
  made = Hosts(str(tmp_path / 'netns-logs'))
  try:
    made.create()
  except Unusable as e:
    pytest.skip(f'network namespaces are not usable here: {e}')
  try:
    yield made
  finally:
    made.destroy()


def nft_or_skip() -> str:
  """The absolute path of `nft`; skips the test (saying why) without it."""
  nft = find_tool('nft')
  if nft is None:
    pytest.skip('`nft` not found (on PATH or in sbin): install the Debian '
                'package nftables to run the firewall test')
  return nft
