"""Builds the pixel ops (`zstd_ops.cc`, `stack_ops.cc`, `cell_encoder.cc`)
into `_zstd_ops.so`.

One library holds the ops a frame-stacked buffer reads and writes with: zstd
compression (`zstd_ops.cc`, with zstd itself), the frame-stack gather
(`stack_ops.cc`) and the writers' one-call frame cell (`cell_encoder.cc`).
Only a C++ compiler is needed: zstd is compiled from the source the
`zstandard` distribution carries (`zstd_source`), so no system zstd is
used. `build(output)` compiles zstd's `zstd.c` (as C) and the op
sources (with TensorFlow's own flags, `tf.sysconfig`) at once, links them
with zstd's symbols hidden, and renames the library into place, so a process
loading it never sees half a file. Beside it, `<library>.key` records what it
was built from (`library_key()`: TensorFlow's version and a hash of the
sources and flags).

`ensure_built()` is what a process that needs the op calls (the pattern of
PyTorch's `cpp_extension.load`): the library lives in a per-user cache,
`<cache>/ops/<key>/_zstd_ops.so`, built there the first time (one log line
says so), under a file lock so that processes starting at once build it once,
and reused afterwards. The cache is `$SMART_REPLAY_CACHE_DIR`, else
`$XDG_CACHE_HOME/smart_replay`, else `~/.cache/smart_replay`; it must be the
user's own and writable by nobody else (a library loaded from it runs as the
user), and links in it are never followed.

The cache, its checks and its lock serve `bind_address` too:
`cached_library(name, key, make)` is `ensure_built` for any library built
by `make` (with `run_commands` and `install_library`).

`python -m smart_replay.ops.build` (what `make ops` runs) builds the cached
library now; `--output=PATH` builds one library at PATH instead (Bazel's
genrule), `--force` builds again.
"""

import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Optional, Sequence

from absl import flags
from absl import logging

from smart_replay import errors
from smart_replay.ops import zstd_source

# The op sources, compiled and linked into one library.
SOURCE_NAMES = ('zstd_ops.cc', 'stack_ops.cc', 'cell_encoder.cc')
LIBRARY_NAME = '_zstd_ops.so'
KEY_SUFFIX = '.key'
CACHE_ENV = 'SMART_REPLAY_CACHE_DIR'
# Bump when the commands below change what they produce.
RECIPE = 'zstd.c+ops.cc -O2 -fPIC hidden-zstd v2'
DEFAULT_LOCK_TIMEOUT_S = 900.0
COMPILE_TIMEOUT_S = 600.0
_HERE = os.path.dirname(os.path.abspath(__file__))
# zstd's own symbols stay inside the library (another zstd loaded in the
# process, TensorFlow's or a Python module's, is never mixed with ours).
_HIDDEN = '__attribute__((visibility("hidden")))'
ZSTD_DEFINES = [f'-D{macro}={_HIDDEN}' for macro in (
    'ZSTDLIB_VISIBLE', 'ZSTDERRORLIB_VISIBLE', 'ZDICTLIB_VISIBLE')]
_COMPILER_HINT = ('install a C++ compiler (Debian/Ubuntu: apt-get install '
                  'g++), or name one with compiler= or $CXX')


class OpBuildError(errors.SmartReplayError, RuntimeError):
  """The zstd op could not be built; the message names the cause."""


def source_paths() -> List[str]:
  """Returns the paths of the op sources (`SOURCE_NAMES`)."""
  return [os.path.join(_HERE, name) for name in SOURCE_NAMES]


def key_path(library: str) -> str:
  """Returns the path of the key file written beside `library`."""
  return library + KEY_SUFFIX


def library_key(tf_version: Optional[str] = None) -> str:
  """What a library must have been built from to be used in this process.

  Args:
    tf_version: TensorFlow's version; None: the installed one's.

  Returns:
    `tf<version>-<16 hex digits>`: the digits hash the op sources, zstd's
    source distribution and the build recipe.
  """
  if tf_version is None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf_version = tf.__version__
  digest = hashlib.sha256()
  for path in source_paths():
    with open(path, 'rb') as f:
      digest.update(f.read())
    digest.update(b'\0')
  digest.update(f'{zstd_source.SOURCE_ID}\0{zstd_source.SHA256}\0{RECIPE}'
                .encode())
  return f'tf{tf_version}-{digest.hexdigest()[:16]}'


def read_key(library: str) -> Optional[str]:
  """Returns the key recorded beside `library`, or None if there is none."""
  try:
    with open(key_path(library)) as f:
      return f.read().strip()
  except OSError:
    return None


def default_compiler() -> str:
  """Returns `$CXX` if set, else 'g++'."""
  return os.environ.get('CXX') or 'g++'


def checked_compiler(compiler: Optional[str] = None) -> str:
  """Returns `compiler` (None: `default_compiler()`) if it can be run.

  Args:
    compiler: a C++ compiler's name on PATH or its path, or None.

  Returns:
    The compiler.

  Raises:
    ValueError: `compiler` is not a non-empty string.
    OpBuildError: it is not found; says what to install.
  """
  compiler = default_compiler() if compiler is None else compiler
  if not isinstance(compiler, str) or not compiler:
    raise ValueError(f'compiler must be a non-empty string, got {compiler!r}')
  if shutil.which(compiler) is None:
    raise OpBuildError(f'no C++ compiler: {compiler!r} is not on PATH; '
                       f'{_COMPILER_HINT}.')
  return compiler


def compile_commands(output: str, *, zstd_dir: str, work_dir: str,
                     compiler: str = 'g++') -> List[List[str]]:
  """Returns the commands that build the op into `output`.

  Args:
    output: the shared library to write.
    zstd_dir: a folder holding zstd's source (`zstd_source.FILES`).
    work_dir: where the object files go.
    compiler: the C++ compiler (it compiles zstd.c as C).

  Returns:
    `[compile zstd.c, compile each op source, link]`; all but the last may
    run at once.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  common = ['-O2', '-fPIC', '-I' + zstd_dir] + ZSTD_DEFINES
  objects = [os.path.join(work_dir, 'zstd.o')]
  commands = [[compiler, '-x', 'c', '-std=gnu11', '-c',
               os.path.join(zstd_dir, 'zstd.c'), '-o', objects[0]] + common]
  for source in source_paths():
    objects.append(os.path.join(
        work_dir, os.path.splitext(os.path.basename(source))[0] + '.o'))
    commands.append([compiler, '-c', source, '-o', objects[-1]] + common +
                    list(tf.sysconfig.get_compile_flags()))
  commands.append([compiler, '-shared'] + objects[1:] + objects[:1] +
                  ['-o', output] + list(tf.sysconfig.get_link_flags()))
  return commands


def run_commands(commands: Sequence[List[str]], *,
                 what: str = 'the zstd op') -> None:
  """Runs `commands` at once; raises OpBuildError naming the first failure.

  Args:
    commands: the compiler commands (argument lists).
    what: what they build, for the message ('the zstd op').

  Raises:
    OpBuildError: a command failed or did not finish in time; names `what`,
      the command and the end of its output.
  """
  running = [subprocess.Popen(c, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL) for c in commands]
  failures = []
  try:
    for command, process in zip(commands, running):
      try:
        output, _ = process.communicate(timeout=COMPILE_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        failures.append(f'{command[0]} did not finish compiling within '
                        f'{COMPILE_TIMEOUT_S:g} s')
        continue
      if process.returncode != 0:
        failures.append(f'{" ".join(command[:6])} ... failed (exit '
                        f'{process.returncode}):\n{output.strip()[-4000:]}')
  finally:
    for process in running:
      if process.poll() is None:
        process.kill()
        process.wait()
  if failures:
    raise OpBuildError(f'building {what} failed: {failures[0]}')


def build(output: str, *, zstd_dir: str, compiler: Optional[str] = None
          ) -> str:
  """Compiles the op into `output` (and its key into `output.key`).

  Args:
    output: the library's path; its folder must exist.
    zstd_dir: a folder holding zstd's source (`zstd_source.fetch`).
    compiler: the C++ compiler (a name on PATH or a path); None:
      `default_compiler()`.

  Returns:
    `output`.

  Raises:
    OpBuildError: no compiler, zstd's source incomplete, or compiling
      failed; the message names what to install or the compiler's error.
  """
  compiler = checked_compiler(compiler)
  folder = os.path.dirname(os.path.abspath(output))
  if not os.path.isdir(folder):
    raise ValueError(f'output must be in an existing folder, got {output!r}')
  if not zstd_source.is_complete(zstd_dir):
    raise OpBuildError(f'{zstd_dir} does not hold zstd\'s source files '
                       f'{zstd_source.FILES}')
  key = library_key()
  work = tempfile.mkdtemp(prefix='.' + LIBRARY_NAME + '.', dir=folder)
  try:
    temporary = os.path.join(work, LIBRARY_NAME)
    commands = compile_commands(temporary, zstd_dir=zstd_dir, work_dir=work,
                                compiler=compiler)
    run_commands(commands[:-1])
    run_commands(commands[-1:])
    install_library(temporary, output, key)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  return output


def install_library(temporary: str, output: str, key: str) -> None:
  """Moves a library just built at `temporary` to `output`, with its key.

  The library is made executable and renamed into place, so a process
  loading `output` never sees half a file; the key file goes last (a
  library without its key is built again).

  Args:
    temporary: the built library, in a scratch folder beside `output`.
    output: where it goes.
    key: what it was built from (`read_key` returns it).
  """
  os.chmod(temporary, 0o755)
  key_file = temporary + KEY_SUFFIX
  with open(key_file, 'w') as f:
    f.write(key + '\n')
  if os.path.exists(key_path(output)):
    os.remove(key_path(output))
  os.replace(temporary, output)
  os.replace(key_file, key_path(output))


def cache_root() -> str:
  """Returns the per-user cache folder (see the module docstring)."""
  chosen = os.environ.get(CACHE_ENV)
  if chosen:
    return os.path.abspath(chosen)
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(
      os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'smart_replay')


def _owned_folder(path: str) -> str:
  """Creates `path` (0700) if missing; refuses one that is not safe.

  Raises:
    OpBuildError: `path` is a link, not a folder, not the user's, or
      writable by group or others.
  """
  try:
    os.mkdir(path, 0o700)
  except FileExistsError:
    pass
  except OSError as e:
    raise OpBuildError(f'cannot create the op cache folder {path}: {e}; set '
                       f'${CACHE_ENV} to a folder of your own.') from e
  info = os.lstat(path)
  problem = None
  if stat.S_ISLNK(info.st_mode):
    problem = 'is a symbolic link'
  elif not stat.S_ISDIR(info.st_mode):
    problem = 'is not a folder'
  elif info.st_uid != os.geteuid():
    problem = f'belongs to uid {info.st_uid}, not to you ({os.geteuid()})'
  elif info.st_mode & 0o022:
    problem = (f'is writable by group or others (mode '
               f'{stat.S_IMODE(info.st_mode):o})')
  if problem:
    raise OpBuildError(
        f'refusing the op cache folder {path}: it {problem}, and a library '
        f'loaded from it would run as you. Remove it, `chmod go-w` it, or set'
        f' ${CACHE_ENV} to a folder of your own.')
  return path


def _cache_folders(root: str) -> str:
  """Creates the cache root (parents as needed) and checks it; returns it."""
  parent = os.path.dirname(root)
  if not os.path.isdir(parent):
    os.makedirs(parent, mode=0o700, exist_ok=True)
  return _owned_folder(root)


def _zstd_source() -> str:
  """zstd's source in the cache (`<cache>/sources`), fetched if missing.

  Raises:
    OpBuildError: the cache is not safe, or the source cannot be fetched.
  """
  sources = _owned_folder(os.path.join(_cache_folders(cache_root()),
                                       'sources'))
  try:
    return zstd_source.fetch(sources)
  except zstd_source.SourceFetchError as e:
    raise OpBuildError(str(e)) from e


class _BuildLock:
  """An exclusive `flock` on `path`, waited for up to `timeout_s`; `what`
  names what is being built in its messages ('the zstd op')."""

  def __init__(self, path: str, timeout_s: float, what: str = 'the zstd op'):
    self._path = path
    self._timeout_s = timeout_s
    self._what = what
    self._fd = None

  def __enter__(self) -> '_BuildLock':
    self._fd = os.open(self._path,
                       os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o600)
    deadline = time.monotonic() + self._timeout_s
    told = False
    while True:
      try:
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return self
      except BlockingIOError:
        if time.monotonic() >= deadline:
          os.close(self._fd)
          raise OpBuildError(
              f'another process held the build lock of {self._what} '
              f'{self._path} for {self._timeout_s:g} s; is a build stuck? '
              '(remove the lock file if no build is running)') from None
        if not told:
          logging.warning('Waiting for another process that is building %s '
                          '(lock %s, up to %g s).', self._what, self._path,
                          self._timeout_s)
          told = True
        time.sleep(0.2)

  def __exit__(self, *exc_info) -> None:
    fcntl.flock(self._fd, fcntl.LOCK_UN)
    os.close(self._fd)


def _usable(library: str, key: str) -> bool:
  """Whether the cached `library` is complete, ours and of `key`."""
  try:
    info = os.lstat(library)
  except FileNotFoundError:
    return False
  if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or
      info.st_mode & 0o022):
    raise OpBuildError(
        f'refusing {library}: not a regular file of yours that only you can '
        'write; remove it and it is built again.')
  return read_key(library) == key


def cached_library(library_name: str, key: str,
                   make: Callable[[str], None], *, what: str,
                   force: bool = False,
                   lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> str:
  """Returns `<cache>/ops/<key>/<library_name>`, made by `make` if needed.

  The folders are checked (the user's own, writable by nobody else); the
  library is reused when its key file says `key`, else `make(path)` writes
  it (with its key file, see `build`) under the folder's file lock, which
  other processes wait for.

  Args:
    library_name: the library's file name.
    key: what it must have been built from (also the folder's name).
    make: builds the library at the path it is given.
    what: what it is, for messages ('the zstd op').
    force: build again even if a usable library is there.
    lock_timeout_s: how long to wait for another process's build.

  Returns:
    The library's path.

  Raises:
    OpBuildError: the cache is not safe, or another process held the lock
      for `lock_timeout_s`; or what `make` raises.
  """
  ops = _owned_folder(os.path.join(_cache_folders(cache_root()), 'ops'))
  folder = _owned_folder(os.path.join(ops, key))
  library = os.path.join(folder, library_name)
  if not force and _usable(library, key):
    return library
  with _BuildLock(os.path.join(ops, key + '.lock'), lock_timeout_s, what):
    if not force and _usable(library, key):  # Built while we waited.
      return library
    make(library)
  return library


def ensure_built(*, compiler: Optional[str] = None, force: bool = False,
                 lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> str:
  """Returns the cached library for this TensorFlow, building it if needed.

  Args:
    compiler: as for `build`.
    force: build again even if a cached library is there.
    lock_timeout_s: how long to wait for another process's build.

  Returns:
    The library's path, `<cache>/ops/<key>/_zstd_ops.so`.

  Raises:
    OpBuildError: the cache is not safe, zstd's source cannot be fetched, no
      compiler, or compiling failed; the message says what to do.
  """
  key = library_key()

  def make(library: str) -> None:
    chosen = checked_compiler(compiler)  # Before fetching anything.
    zstd_dir = _zstd_source()
    started = time.monotonic()
    # A warning, so that it shows by default: the caller waits a minute.
    logging.warning('Building the zstd op for TensorFlow %s into %s (once '
                    'for this TensorFlow and source; about a minute).',
                    key.split('-')[0][2:], os.path.dirname(library))
    build(library, zstd_dir=zstd_dir, compiler=chosen)
    logging.info('Built the zstd op in %.0f s.', time.monotonic() - started)

  return cached_library(LIBRARY_NAME, key, make, what='the zstd op',
                        force=force, lock_timeout_s=lock_timeout_s)


def main(argv: Optional[List[str]] = None) -> int:
  """Builds the op; prints the library's path or the error.

  Args:
    argv: command-line arguments: `--force` builds again,
      `--output=PATH` builds one library at PATH (Bazel's genrule; zstd's
      source from the cache) instead of the cached one.

  Returns:
    The exit status: 0 on success, 1 if the build failed, 2 for unknown
    arguments.
  """
  argv = sys.argv[1:] if argv is None else argv
  usage = ('usage: python -m smart_replay.ops.build [--force] '
           '[--output=PATH]\nBuilds the zstd op into the per-user cache '
           f'({cache_root()}), or at PATH; --force builds it again.')
  if '--help' in argv or '-h' in argv:
    print(usage)
    return 0
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # Before TF loads.
  output = None
  unknown = []
  for arg in argv:
    if arg.startswith('--output='):
      output = arg[len('--output='):]
    elif arg != '--force':
      unknown.append(arg)
  if unknown:
    print(f'{usage}\nunknown arguments: {unknown}', file=sys.stderr)
    return 2
  flags.FLAGS.mark_as_parsed()  # absl logging without its warning about it.
  logging.set_verbosity(logging.INFO)
  try:
    if output is None:
      path = ensure_built(force='--force' in argv)
    else:
      path = build(output, zstd_dir=_zstd_source())
  except (OpBuildError, ValueError) as e:
    print(f'smart_replay.ops.build: {e}', file=sys.stderr)
    return 1
  print(path)
  return 0


if __name__ == '__main__':
  sys.exit(main())
