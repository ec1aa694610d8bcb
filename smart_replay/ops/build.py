"""Compiles the zstd TensorFlow op (`zstd_ops.cc`) into `_zstd_ops.so`.

`build()` runs g++ with TensorFlow's own compile and link flags
(`tf.sysconfig`), `-O2 -fPIC -shared` and `-lzstd`, and writes the library
next to `zstd.py` (where `smart_replay.ops.zstd` loads it) unless told
otherwise. It compiles only when the library is missing or older than the
source, and replaces it atomically, so a process loading it never sees half a
file. `python -m smart_replay.ops.build` (what `make ops` runs) builds it.

Needs a C++17 compiler (`apt-get install g++`) and the zstd headers and
library (`apt-get install libzstd-dev`); an error names whichever is missing.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from typing import List, Optional

from smart_replay import errors

SOURCE_NAME = 'zstd_ops.cc'
LIBRARY_NAME = '_zstd_ops.so'
_HERE = os.path.dirname(os.path.abspath(__file__))
_ZSTD_HINT = ('the zstd headers and library are missing: apt-get install '
              'libzstd-dev')


class OpBuildError(errors.SmartReplayError, RuntimeError):
  """The zstd op could not be compiled; the message names the cause."""


def source_path() -> str:
  """Returns the path of `zstd_ops.cc`."""
  return os.path.join(_HERE, SOURCE_NAME)


def library_path(output_dir: Optional[str] = None) -> str:
  """Returns where `build(output_dir)` writes `_zstd_ops.so`.

  Args:
    output_dir: the directory; None for this package's directory.

  Returns:
    The library's path.
  """
  return os.path.join(output_dir or _HERE, LIBRARY_NAME)


def is_up_to_date(output_dir: Optional[str] = None) -> bool:
  """Whether the library exists and is not older than its source.

  Args:
    output_dir: as for `build`.

  Returns:
    True if `build(output_dir)` would not compile.
  """
  library = library_path(output_dir)
  return (os.path.exists(library) and
          os.path.getmtime(library) >= os.path.getmtime(source_path()))


def compile_command(output: str, compiler: str = 'g++') -> List[str]:
  """Returns the compiler command line that builds the op into `output`.

  Args:
    output: the path of the shared library to write.
    compiler: the C++ compiler to run.

  Returns:
    The argument list, TensorFlow's flags included.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return ([compiler, '-shared', '-fPIC', '-O2', source_path(), '-o', output] +
          list(tf.sysconfig.get_compile_flags()) +
          list(tf.sysconfig.get_link_flags()) + ['-lzstd'])


def _check_zstd_header(compiler: str) -> None:
  """Raises OpBuildError if `compiler` cannot find `zstd.h`."""
  probe = subprocess.run([compiler, '-E', '-x', 'c++', '-', '-o', os.devnull],
                         input='#include <zstd.h>\n', capture_output=True,
                         text=True, check=False)
  if probe.returncode != 0:
    raise OpBuildError(f'zstd.h not found by {compiler}: {_ZSTD_HINT}. '
                       f'({probe.stderr.strip()[:300]})')


def build(output_dir: Optional[str] = None, *, compiler: str = 'g++',
          force: bool = False) -> str:
  """Compiles `zstd_ops.cc` into `_zstd_ops.so` unless it is up to date.

  Args:
    output_dir: where to write the library; None for this package's
      directory, where `smart_replay.ops.zstd` loads it from.
    compiler: the C++ compiler (a name on PATH or a path).
    force: compile even if the library is newer than the source (after a
      TensorFlow upgrade, say).

  Returns:
    The path of the library.

  Raises:
    OpBuildError: the compiler or zstd (headers, library) is missing, or
      compiling failed; the message names what to install or the compiler's
      error.
  """
  if not isinstance(compiler, str) or not compiler:
    raise ValueError(f'compiler must be a non-empty string, got {compiler!r}')
  if output_dir is not None and not os.path.isdir(output_dir):
    raise ValueError(f'output_dir must be an existing directory, got '
                     f'{output_dir!r}')
  library = library_path(output_dir)
  if not os.path.exists(source_path()):
    if os.path.exists(library) and not force:  # Built, shipped without it.
      return library
    raise OpBuildError(f'the op source {source_path()} is missing')
  if not force and is_up_to_date(output_dir):
    return library
  if shutil.which(compiler) is None:
    raise OpBuildError(f'C++ compiler {compiler!r} not found on PATH: '
                       'apt-get install g++ (or pass compiler=)')
  _check_zstd_header(compiler)

  # Compile to a temporary name beside the target, then rename over it.
  handle, temporary = tempfile.mkstemp(
      prefix='.' + LIBRARY_NAME + '.', suffix='.tmp',
      dir=os.path.dirname(library))
  os.close(handle)
  try:
    result = subprocess.run(compile_command(temporary, compiler),
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
      output = (result.stderr or result.stdout).strip()
      if 'cannot find -lzstd' in output:
        raise OpBuildError(f'libzstd.so not found by the linker: {_ZSTD_HINT}')
      raise OpBuildError(f'compiling {source_path()} failed '
                         f'(exit {result.returncode}):\n{output[-4000:]}')
    os.chmod(temporary, 0o755)
    os.replace(temporary, library)
  finally:
    if os.path.exists(temporary):
      os.remove(temporary)
  return library


def main(argv: Optional[List[str]] = None) -> int:
  """Builds the op into this package; prints its path or the error.

  Args:
    argv: command-line arguments; `--force` rebuilds an up-to-date library,
      `--output_dir=DIR` writes it into DIR (Bazel's genrule) instead.

  Returns:
    The exit status: 0 on success, 1 if the build failed, 2 for unknown
    arguments.
  """
  argv = sys.argv[1:] if argv is None else argv
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # Before TF loads.
  output_dir = None
  unknown = []
  for arg in argv:
    if arg.startswith('--output_dir='):
      output_dir = arg[len('--output_dir='):]
    elif arg != '--force':
      unknown.append(arg)
  if unknown:
    print(f'usage: python -m smart_replay.ops.build [--force] '
          f'[--output_dir=DIR]; unknown arguments {unknown}',
          file=sys.stderr)
    return 2
  try:
    path = build(output_dir, force='--force' in argv)
  except (OpBuildError, ValueError) as e:
    print(f'smart_replay.ops.build: {e}', file=sys.stderr)
    return 1
  print(path)
  return 0


if __name__ == '__main__':
  sys.exit(main())
