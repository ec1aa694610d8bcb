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
  """The example parses its flags as any absl program (`app.run(main)`).

  absl 2.x exits 1 both after `--help` (the module docstring and the
  program's own flags, on stdout) and on a bad flag (one line on stderr,
  `FATAL Flags parsing error: Unknown command line flag 'root_dri'. Did you
  mean: root_dir ?`, then a hint to pass --helpshort or --helpfull); `main`
  does not run in either case.
  """
  helped = run(name, ['--help'], cwd, timeout_s=120)
  assert helped.returncode == 1, helped.stderr[-2000:]
  assert '--root_dir' in helped.stdout
  assert f'examples/{name}.py' in helped.stdout  # The docstring's command.
  typo = run(name, ['--root_dri=x'], cwd, timeout_s=120)
  assert typo.returncode == 1, typo.stderr[-2000:]
  errors = [line for line in typo.stderr.splitlines()
            if line.startswith('FATAL Flags parsing error')]
  assert len(errors) == 1, typo.stderr[-2000:]
  assert "Unknown command line flag 'root_dri'" in errors[0], errors
  assert os.listdir(cwd) == [], os.listdir(cwd)  # main did not run.
