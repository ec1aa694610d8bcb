"""Binding Reverb's port to one address: the LD_PRELOAD library of
`bind_address.c`, and the checks around it.

Reverb 0.14's server always listens on `[::]:PORT`, every interface, and its
Python API has no address argument. A process started with the library in
`LD_PRELOAD` and `SMART_REPLAY_BIND_ADDRESS=PORT,ADDRESS` in its environment
binds PORT to ADDRESS instead (and its own connections to a loopback address
on PORT go to ADDRESS), and closes every connection to PORT that another user
of this machine opened, before the program sees it (the peer's socket owner,
asked of the kernel's sock_diag interface). With
`SMART_REPLAY_CONNECTION_CAP=CAP_PORT,N` too, a peer (a user of this machine,
or another machine's address) holds at most N connections to CAP_PORT (a
control service's) at once; see `bind_address.c`. `LD_PRELOAD` acts only on a
process started with it, so `smart-replay-serve` restarts itself with it
(`ensure_in_force`, before TensorFlow or Reverb is loaded); a process that
is already running (an in-process buffer) cannot be changed so.

* `check_host(host)`: an address Reverb's port may bind ('127.0.0.1', an
  address of this machine's interfaces, or '0.0.0.0' / '::' for every
  interface); a bad one is a `ValueError` naming it.
* `ensure_in_force(port, host, connection_cap=...)`: returns when this
  process binds `port` to `host` (the library is in force, or `host` is
  every interface); else replaces the process with itself started with the
  library (the same program and arguments, the same process id).
* `require(port, host)`: the same check without the restart; says how to
  start a process with the library.
* `check_listening(port, host)`: this process's listening sockets on `port`,
  read from `/proc/net/tcp{,6}`, are on `host` and nowhere else.

The library (`_bind_address.so`) is a prebuilt one beside this module when
its key matches (Bazel builds it so), else the per-user cached one,
compiled the first time (well under a second) from `bind_address.c` by the
C++ compiler (`build.checked_compiler`, as C) into
`<cache>/ops/<key>/_bind_address.so` under the cache's checks and lock
(`build.cached_library`). Where it cannot be built there is no fallback: a
`BindAddressError` says what to install.

`python -m smart_replay.ops.bind_address` builds the cached library and
prints its path; `--output=PATH` builds one at PATH (Bazel's genrule).
"""

import ctypes
import hashlib
import ipaddress
import os
import shutil
import socket
import sys
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from smart_replay import errors
from smart_replay.ops import build
from smart_replay.utils import listening

SOURCE_NAME = 'bind_address.c'
LIBRARY_NAME = '_bind_address.so'
# Read (then removed) by the library at load: 'PORT,ADDRESS'.
ADDRESS_ENV = 'SMART_REPLAY_BIND_ADDRESS'
# Read (then removed) with it: 'PORT,N', N connections per peer to PORT.
CAP_ENV = 'SMART_REPLAY_CONNECTION_CAP'
# LD_PRELOAD before the restart (the library puts it back); unset if absent.
PRELOAD_WAS_ENV = 'SMART_REPLAY_BIND_LD_PRELOAD'
# Set for the restarted process: 'PORT,ADDRESS' it must find in force.
RESTARTED_ENV = 'SMART_REPLAY_BIND_RESTARTED'
LOOPBACK = '127.0.0.1'
EVERY_INTERFACE = ('0.0.0.0', '::')
# Bump when the command below changes what it produces.
RECIPE = 'bind_address.c -x c -std=gnu11 -O2 -fPIC -shared v1'
_HERE = os.path.dirname(os.path.abspath(__file__))
_WHAT = 'the bind-address library'
_INSTALL_HINT = ('It needs only a C++ compiler (Debian/Ubuntu: apt-get install'
                 ' g++), or name one with $CXX; `python -m '
                 'smart_replay.ops.bind_address` builds it ahead of time.')


class BindAddressError(errors.SmartReplayError, RuntimeError):
  """Reverb's port cannot be bound, or is not bound, as asked; says why."""


def check_host(host: Any) -> str:
  """Checks an address for Reverb's port; returns it written canonically.

  Args:
    host: '127.0.0.1' (this machine only), '::1', an IPv4 or IPv6 address
      of one of this machine's interfaces, or '0.0.0.0' / '::' (every
      interface, IPv4 and IPv6 alike: Reverb's own `[::]`).

  Returns:
    The address as `ipaddress` writes it (an IPv4 address mapped into IPv6,
    '::ffff:a.b.c.d', as IPv4).

  Raises:
    ValueError: `host` is not an IP address (names are refused: one may
      resolve to several addresses), is multicast, an IPv6 link-local
      address (it needs an interface scope), or not an address of this
      machine; names the value.
  """
  if not isinstance(host, str):
    raise ValueError(f'reverb_host={host!r} is not an IP address string.')
  try:
    address = ipaddress.ip_address(host)
  except ValueError:
    raise ValueError(
        f'reverb_host={host!r} is not an IP address: give 127.0.0.1 (this '
        "machine only), an interface's address, or 0.0.0.0 / :: (every "
        'interface); names are not accepted (one may resolve to several '
        'addresses).') from None
  if getattr(address, 'scope_id', None):
    raise ValueError(f'reverb_host={host!r} has an interface scope; give the'
                     ' address alone.')
  mapped = getattr(address, 'ipv4_mapped', None)
  address = mapped or address
  text = str(address)
  if text in EVERY_INTERFACE:
    return text
  if address.is_multicast:
    raise ValueError(f'reverb_host={host!r} is a multicast address.')
  if address.version == 6 and address.is_link_local:
    raise ValueError(f'reverb_host={host!r} is an IPv6 link-local address, '
                     'which needs an interface scope; give another address '
                     'of the interface.')
  family = socket.AF_INET if address.version == 4 else socket.AF_INET6
  try:
    with socket.socket(family, socket.SOCK_STREAM) as probe:
      probe.bind((text, 0))
  except OSError as e:
    raise ValueError(
        f'reverb_host={host!r} is not an address of this machine '
        f'({e.strerror}; `ip -brief address` lists them).') from None
  return text


def everywhere(host: str) -> bool:
  """Whether `host` ('0.0.0.0' or '::') means every interface."""
  return host in EVERY_INTERFACE


def address_for_clients(host: str, port: int) -> str:
  """'host:port' (IPv6 in brackets) of `host`, an address `check_host`
  returned; not for `everywhere` hosts."""
  return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


# ------------------------------------------------------------ the library


def source_path() -> str:
  """Returns the path of `bind_address.c`."""
  return os.path.join(_HERE, SOURCE_NAME)


def prebuilt_path() -> str:
  """Returns where a prebuilt library beside this module would be."""
  return os.path.join(_HERE, LIBRARY_NAME)


def library_key() -> str:
  """`bind-<16 hex digits>`: a hash of the source and the build recipe."""
  digest = hashlib.sha256()
  with open(source_path(), 'rb') as f:
    digest.update(f.read())
  digest.update(f'\0{RECIPE}'.encode())
  return f'bind-{digest.hexdigest()[:16]}'


def compile_command(output: str, compiler: str) -> List[str]:
  """The command that builds the library into `output` with `compiler`."""
  return [compiler, '-x', 'c', '-std=gnu11', '-O2', '-fPIC', '-shared',
          '-Wall', source_path(), '-o', output, '-x', 'none', '-ldl']


def build_library(output: str, *, compiler: Optional[str] = None) -> str:
  """Compiles the library into `output` (and its key into `output.key`).

  Args:
    output: the library's path; its folder must exist.
    compiler: a C++ (or C) compiler's name on PATH or path; None:
      `build.default_compiler()` ($CXX, else g++).

  Returns:
    `output`.

  Raises:
    ValueError: `output`'s folder does not exist.
    OpBuildError: no compiler, or compiling failed; names it.
  """
  compiler = build.checked_compiler(compiler)
  folder = os.path.dirname(os.path.abspath(output))
  if not os.path.isdir(folder):
    raise ValueError(f'output must be in an existing folder, got {output!r}')
  work = tempfile.mkdtemp(prefix='.' + LIBRARY_NAME + '.', dir=folder)
  try:
    temporary = os.path.join(work, LIBRARY_NAME)
    build.run_commands([compile_command(temporary, compiler)], what=_WHAT)
    build.install_library(temporary, output, library_key())
  finally:
    shutil.rmtree(work, ignore_errors=True)
  return output


def library_path() -> str:
  """The library this process preloads, built first if needed.

  A prebuilt library beside this module when its key file matches
  `library_key()`; otherwise the per-user cached one, built if missing.

  Returns:
    Its path.

  Raises:
    BindAddressError: it is not prebuilt and cannot be built here (no
      compiler, an unsafe cache); says what to install.
  """
  key = library_key()
  prebuilt = prebuilt_path()
  if os.path.exists(prebuilt) and build.read_key(prebuilt) == key:
    return prebuilt
  try:
    return build.cached_library(
        LIBRARY_NAME, key, lambda path: build_library(path), what=_WHAT)
  except build.OpBuildError as e:
    raise BindAddressError(
        f'Reverb 0.14 listens on every interface, and {_WHAT} that binds its'
        f' port to one address could not be built: {e} {_INSTALL_HINT}'
    ) from e


def preload_environment(
    port: int, host: str, library: str, environ: Mapping[str, str], *,
    connection_cap: Optional[Tuple[int, int]] = None) -> Dict[str, str]:
  """`environ` with the variables that start a process with the library.

  Args:
    port: the port to bind to `host`.
    host: an address `check_host` returned, not every interface.
    library: the library's path.
    environ: the environment to extend (e.g. `os.environ`).
    connection_cap: `(port, n)`: at most n connections per peer to that
      port at once; None: no cap.

  Returns:
    A new environment: `LD_PRELOAD` names the library first (then what it
    held, which the library puts back when it loads),
    `SMART_REPLAY_BIND_ADDRESS` says 'PORT,ADDRESS' and
    `SMART_REPLAY_CONNECTION_CAP` 'PORT,N' (removed without a cap).

  Raises:
    BindAddressError: the library's path holds a space or a colon, which
      `LD_PRELOAD` cannot carry.
  """
  if any(c in library for c in ' :\t\n'):
    raise BindAddressError(
        f'{_WHAT} {library!r} has a space or colon in its path, which '
        f'LD_PRELOAD cannot name; set ${build.CACHE_ENV} to a folder '
        'without them.')
  env = dict(environ)
  before = env.get('LD_PRELOAD')
  if before is not None:
    env[PRELOAD_WAS_ENV] = before
  else:
    env.pop(PRELOAD_WAS_ENV, None)
  env['LD_PRELOAD'] = library + (f' {before}' if before else '')
  env[ADDRESS_ENV] = f'{port},{host}'
  env.pop(CAP_ENV, None)
  if connection_cap is not None:
    env[CAP_ENV] = '%d,%d' % connection_cap
  return env


def _call(name: str, restype: Any, default: Any) -> Any:
  """Calls the loaded library's `smart_replay_bind_address_<name>()`;
  `default` if the library is not loaded in this process."""
  try:
    function = getattr(ctypes.CDLL(None), f'smart_replay_bind_address_{name}')
  except AttributeError:
    return default
  function.restype = restype
  return function()


def in_force() -> Optional[Tuple[int, str]]:
  """`(port, address)` the library loaded in this process rewrites, or None
  (not loaded, or loaded without a valid `SMART_REPLAY_BIND_ADDRESS`)."""
  port = _call('port', ctypes.c_int, 0)
  if not port:
    return None
  host = _call('host', ctypes.c_char_p, None)
  return port, str(ipaddress.ip_address(host.decode()))


def connection_cap() -> Optional[Tuple[int, int]]:
  """`(port, n)`: the loaded library lets a peer hold at most n connections
  to that port at once; None (no cap, or the library is not in force)."""
  port = _call('capped_port', ctypes.c_int, 0)
  return (port, int(_call('per_peer_cap', ctypes.c_long, 0))) if port else None


def load_error() -> Optional[str]:
  """Why the loaded library rewrites nothing (a malformed variable), or
  None (loaded fine, or not loaded)."""
  error = _call('error', ctypes.c_char_p, None)
  return error.decode() if error else None


def rewritten_binds() -> int:
  """How many binds the loaded library rewrote (0 if it is not loaded)."""
  return int(_call('rewrites', ctypes.c_long, 0))


def refused_connections() -> int:
  """How many connections to the port the loaded library closed because
  another user of this machine opened them (0 if it is not loaded)."""
  return int(_call('refused', ctypes.c_long, 0))


def _cap_in_force_is(wanted: Optional[Tuple[int, int]]) -> bool:
  """Whether the connection cap in force in this process is `wanted`."""
  return connection_cap() == (tuple(wanted) if wanted else None)


def refused_over_cap() -> int:
  """How many connections the loaded library closed because their peer
  held its `connection_cap` already (0 if it is not loaded)."""
  return int(_call('refused_over_cap', ctypes.c_long, 0))


def _check_port(port: Any) -> None:
  if isinstance(port, bool) or not isinstance(port, int) or not (
      0 < port < 65536):
    raise ValueError(f'port must be an int in 1..65535, got {port!r}.')


def require(port: int, host: str) -> None:
  """Checks that this process will bind `port` to `host` as asked.

  Args:
    port: Reverb's port.
    host: an address `check_host` returned.

  Raises:
    ValueError: `port` is not a port.
    BindAddressError: `host` is one address and the library is not in
      force for it in this process, or this process was started to bind
      `port` to another address; says how to start one that binds it.
  """
  _check_port(port)
  found = in_force()
  if found == (port, host) or (everywhere(host) and (
      found is None or found[0] != port)):
    return
  now = (f'this process binds port {found[0]} to {found[1]}' if found else
         f'{_WHAT} is not loaded in this process')
  raise BindAddressError(
      f'Reverb 0.14 listens on every interface; binding port {port} to '
      f'{host} needs the process started with {_WHAT}, and {now}. '
      f'`smart-replay-serve --reverb_host={host}` restarts itself with it; '
      'another program starts with LD_PRELOAD=$(python -m '
      f'smart_replay.ops.bind_address) {ADDRESS_ENV}={port},{host}. Or pass '
      "reverb_host='0.0.0.0' to serve on every interface.")


def ensure_in_force(port: int, host: str, *,
                    connection_cap: Optional[Tuple[int, int]] = None,
                    argv: Optional[Sequence[str]] = None) -> None:
  """Returns once this process binds `port` to `host`, restarting it with
  the library first if needed.

  Call it early, before TensorFlow or Reverb is loaded (a restart then
  costs little). When `host` is every interface there is nothing to do.
  When the library is already in force for `port` and `host`, it returns
  (and drops the restart marker, so that child processes start clean).
  Otherwise the process is replaced with the same interpreter and
  arguments, started with the library (`os.execve`: the same process id;
  stdout and stderr are flushed, and file descriptor 2 is pointed back at
  `sys.stderr`'s file, since a filter of native logs may have taken it).

  Args:
    port: Reverb's port.
    host: an address `check_host` returned.
    connection_cap: `(port, n)`: at most n connections per peer to that
      port (a control service's) at once, when the library is in force;
      None: no cap.
    argv: the interpreter's arguments to start again with; None:
      `sys.orig_argv`.

  Raises:
    ValueError: `port` (or the cap's) is not a port, or n is not positive.
    BindAddressError: the library cannot be built, or this process is the
      restarted one and the library is still not in force (LD_PRELOAD
      ignored, e.g. in a setuid program); says why.
  """
  _check_port(port)
  if connection_cap is not None:
    _check_port(connection_cap[0])
    if isinstance(connection_cap[1], bool) or not isinstance(
        connection_cap[1], int) or not 0 < connection_cap[1] <= 4096:
      raise ValueError('connection_cap must be (port, n) with n in 1..4096, '
                       f'got {connection_cap!r}.')
  if everywhere(host):
    os.environ.pop(RESTARTED_ENV, None)
    return
  wanted = f'{port},{host}' + (
      ';%d,%d' % connection_cap if connection_cap else '')
  if in_force() == (port, host) and _cap_in_force_is(connection_cap):
    os.environ.pop(RESTARTED_ENV, None)
    return
  if os.environ.get(RESTARTED_ENV) == wanted:
    why = load_error() or (
        f'LD_PRELOAD did not load it (in force: {in_force()}); the dynamic '
        'linker ignores it in setuid programs and prints why on stderr')
    raise BindAddressError(
        f'this process was restarted with {_WHAT} to bind port {port} to '
        f'{host}, but it is not in force: {why}.')
  library = library_path()
  env = preload_environment(port, host, library, os.environ,
                            connection_cap=connection_cap)
  env[RESTARTED_ENV] = wanted
  args = list(sys.orig_argv if argv is None else argv)
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    stderr_fd = sys.stderr.fileno()
  except (AttributeError, OSError, ValueError):
    stderr_fd = 2
  if stderr_fd != 2:
    os.dup2(stderr_fd, 2)
  os.execve(sys.executable, [sys.executable, *args[1:]], env)


def check_listening(port: int, host: str) -> List[str]:
  """Checks that this process listens on `port` at `host` and nowhere else.

  Args:
    port: Reverb's port.
    host: an address `check_host` returned ('0.0.0.0' or '::': every
      interface, which Reverb's `[::]` is).

  Returns:
    The addresses found.

  Raises:
    BindAddressError: it listens elsewhere, or not at all; names both.
  """
  try:
    found = listening.addresses(port)
  except OSError as e:
    raise BindAddressError(str(e)) from None
  if everywhere(host):
    good = bool(found) and set(found) <= set(EVERY_INTERFACE)
  else:
    good = found == [host]
  if not good:
    raise BindAddressError(
        f'Reverb\'s port {port} listens on {found or "no address"} in this '
        f'process, not on {host} as asked (reverb_host={host}); refusing to '
        'serve.')
  return found


def main(argv: Optional[List[str]] = None) -> int:
  """Builds the library; prints its path or the error.

  Args:
    argv: command-line arguments: `--output=PATH` builds one library at
      PATH (Bazel's genrule) instead of the cached one.

  Returns:
    0 on success, 1 if the build failed, 2 for unknown arguments.
  """
  argv = sys.argv[1:] if argv is None else argv
  usage = ('usage: python -m smart_replay.ops.bind_address [--output=PATH]\n'
           f'Builds {_WHAT} (LD_PRELOAD; see smart_replay/ops/bind_address.c)'
           f' into the per-user cache ({build.cache_root()}), or at PATH, and '
           'prints its path.')
  if '--help' in argv or '-h' in argv:
    print(usage)
    return 0
  unknown = [a for a in argv if not a.startswith('--output=')]
  if unknown:
    print(f'{usage}\nunknown arguments: {unknown}', file=sys.stderr)
    return 2
  outputs = [a[len('--output='):] for a in argv]
  try:
    path = (build_library(outputs[-1]) if outputs else library_path())
  except (build.OpBuildError, BindAddressError, ValueError) as e:
    print(f'smart_replay.ops.bind_address: {e}', file=sys.stderr)
    return 1
  print(path)
  return 0


if __name__ == '__main__':
  sys.exit(main())
