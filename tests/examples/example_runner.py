"""Runs an example script as a user runs it, from another directory."""

import os
import subprocess
import sys
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


def run(name: str, args: List[str], cwd: str, timeout_s: float = 600
        ) -> subprocess.CompletedProcess:
  """Runs `examples/<name>.py` with `args` in `cwd`; returns the result.

  Args:
    name: the example's file name without `.py`.
    args: its flags.
    cwd: the working directory (not the repository).
    timeout_s: how long it may take.

  Returns:
    The completed process (stdout and stderr as text).
  """
  return subprocess.run(
      [sys.executable, os.path.join(ROOT, 'examples', f'{name}.py'), *args],
      capture_output=True, text=True, timeout=timeout_s, cwd=cwd)


def check_flags(name: str, cwd: str) -> None:
  """`--help` exits 0 and names the flags; a misspelled flag exits 2 and
  names it."""
  helped = run(name, ['--help'], cwd, timeout_s=120)
  assert helped.returncode == 0, helped.stderr[-2000:]
  assert '--root_dir' in helped.stdout
  typo = run(name, ['--root_dri=x'], cwd, timeout_s=120)
  assert typo.returncode == 2, typo.stderr[-2000:]
  assert 'root_dri' in typo.stderr
