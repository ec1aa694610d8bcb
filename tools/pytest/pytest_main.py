"""Runs one test file under pytest inside `bazel test` (see defs.bzl).

Usage (as the `main` of a `py_pytest` target): `pytest_main.py TEST_FILE
[pytest args...]`. Writes Bazel's JUnit XML, keeps pytest's temporary files in
the test's `TEST_TMPDIR`, honours `--test_filter`, and fails the target when a
`smart_replay` module was imported from outside the runfiles, i.e. through the
virtualenv's editable install because the target's `deps` miss it.
"""

import os
import sys

import pytest

_PACKAGE = 'smart_replay'


def _undeclared_modules(runfiles: str) -> list:
  """`smart_replay` modules loaded from outside `runfiles`."""
  runfiles = os.path.realpath(runfiles)
  outside = []
  for name, module in sorted(sys.modules.items()):
    if name != _PACKAGE and not name.startswith(_PACKAGE + '.'):
      continue
    path = getattr(module, '__file__', None)
    if path and not os.path.abspath(path).startswith(runfiles + os.sep):
      outside.append(f'{name} ({path})')
  return outside


def main(argv: list) -> int:
  """Runs pytest on `argv[0]` with the rest of `argv` as pytest arguments.

  Args:
    argv: the test file, then extra pytest arguments.

  Returns:
    pytest's exit code; 1 if the tests passed but imported `smart_replay`
    modules that the target does not declare.
  """
  if not argv:
    print('usage: pytest_main.py TEST_FILE [pytest args...]', file=sys.stderr)
    return 2
  test_file, extra = argv[0], argv[1:]
  args = [test_file, '-p', 'no:cacheprovider']
  xml = os.environ.get('XML_OUTPUT_FILE')
  if xml:
    args.append('--junitxml=' + xml)
  tmp = os.environ.get('TEST_TMPDIR')
  if tmp:
    args.append('--basetemp=' + os.path.join(tmp, 'pytest'))
  only = os.environ.get('TESTBRIDGE_TEST_ONLY')  # bazel test --test_filter=...
  if only:
    args += ['-k', only]
  code = pytest.main(args + extra)
  runfiles = os.environ.get('RUNFILES_DIR') or os.environ.get('TEST_SRCDIR')
  outside = _undeclared_modules(runfiles) if runfiles else []
  if outside and code == 0:
    print(f'{test_file} imported modules its target does not declare (they '
          'came from the editable install, not the runfiles); add them to '
          'its deps (tools/bazel/build_deps.py --write):\n  '
          + '\n  '.join(outside), file=sys.stderr)
    return 1
  return code


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
