"""Quiet native logs for the command-line binaries.

TensorFlow's C++ code logs INFO lines (and three harmless "Unable to register
cuDNN/cuFFT/cuBLAS factory" errors) while it is imported, and Reverb's C++
code writes every message, whatever its level, to `std::clog` as
`[reverb/cc/file.cc:123] text`: a server start, each checkpoint stored or
loaded, "Still reading compressed trajectory data". Neither can be turned
down from Python once TensorFlow is loaded, and Reverb has no level at all, so
`install()` must run before TensorFlow is imported and works on file
descriptors:

- `TF_CPP_MIN_LOG_LEVEL=2` (unless the user set it) drops TensorFlow's C++
  INFO and WARNING lines at the source;
- file descriptor 2 becomes a pipe to a small filter process that drops
  Reverb's informational lines and TensorFlow's CUDA-registration noise and
  passes everything else through (a Reverb line that mentions an error,
  failure, timeout, ... is kept). Python's own `sys.stderr` (absl logging,
  progress bars, error messages) writes to the real stderr directly, so
  nothing Python prints is delayed or reordered.

The filter runs in its own process (and session, so Ctrl-C does not reach
it): if the binary aborts in C++ (a failed CHECK), the filter still drains the
pipe and the fatal message reaches the terminal.

This module imports nothing heavy; the binaries call `install(sys.argv)` as
their first statement. `--verbose` or `--verbosity=1` (or higher) leaves all
logs as they are.
"""

import os
import re
import subprocess
import sys
from typing import Sequence

# Reverb lines are dropped unless they match KEEP_REVERB.
REVERB_LINE = r'^\[reverb/cc/'
KEEP_REVERB = (r'(?i)error|fail|warn|cannot|can\'t|unable|invalid|timed? ?out|'
               r'abort|check failed|corrupt|lost|deadline|refus|denied')
# TensorFlow lines printed at every import on a machine without a GPU.
TF_NOISE = (r'Unable to register cu(DNN|FFT|BLAS) factory|'
            r'Could not find cuda drivers|TF-TRT Warning|'
            r'oneDNN custom operations are on|'
            r'This TensorFlow binary is optimized|'
            r'To enable the following instructions')

_installed = False

# The filter process: reads lines from stdin, writes the kept ones to stdout
# (the original stderr). Runs with -I -S: no site-packages, no user paths.
_FILTER_PROGRAM = r'''
import re, sys
drop_reverb, keep_reverb, noise = (re.compile(p) for p in sys.argv[1:4])
out = sys.stdout.buffer
for raw in sys.stdin.buffer:
  line = raw.decode('utf-8', 'replace')
  if noise.search(line):
    continue
  if drop_reverb.search(line) and not keep_reverb.search(line):
    continue
  out.write(raw)
  out.flush()
'''


def wants_native_logs(argv: Sequence[str]) -> bool:
  """Tells whether the command line asks for every log line.

  Args:
    argv: the command line, e.g. `sys.argv`.

  Returns:
    True for `--verbose`, `-v` (alone) or `--verbosity=N` / `-v N` with
    N >= 1 (absl's debug level), before a `--` separator.
  """
  args = list(argv[1:])
  if '--' in args:
    args = args[:args.index('--')]
  for i, arg in enumerate(args):
    if arg in ('--verbose', '-v') and not (
        arg == '-v' and i + 1 < len(args) and _is_int(args[i + 1])):
      return True
    level = None
    if arg.startswith(('--verbosity=', '-v=')):
      level = arg.split('=', 1)[1]
    elif arg in ('--verbosity', '-v') and i + 1 < len(args):
      level = args[i + 1]
    if level is not None and _is_int(level) and int(level) >= 1:
      return True
  return False


def _is_int(text: str) -> bool:
  return text.lstrip('-').isdigit()


def keeps(line: str) -> bool:
  """Tells whether the filter passes a line through (for tests and docs).

  Args:
    line: one line written to file descriptor 2 by C++ code.

  Returns:
    False for TensorFlow's import noise and Reverb's informational lines.
  """
  if re.search(TF_NOISE, line):
    return False
  return not (re.search(REVERB_LINE, line) and
              not re.search(KEEP_REVERB, line))


def install(argv: Sequence[str]) -> bool:
  """Quiets TensorFlow's and Reverb's C++ logs for this process.

  Call it before TensorFlow or Reverb is imported. Does nothing when the
  command line asks for every log line (see `wants_native_logs`), when
  stderr is not a file descriptor, or when called twice.

  Args:
    argv: the command line, e.g. `sys.argv`.

  Returns:
    True if the filter was installed.
  """
  global _installed
  if _installed or wants_native_logs(argv):
    return False
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  try:
    stderr_fd = sys.stderr.fileno()
  except (AttributeError, OSError, ValueError):
    return False
  # Python keeps writing to the real stderr, through a duplicate.
  real_stderr = os.dup(stderr_fd)
  read_end, write_end = os.pipe()
  subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, '-I', '-S', '-c', _FILTER_PROGRAM, REVERB_LINE,
       KEEP_REVERB, TF_NOISE],
      stdin=read_end, stdout=real_stderr, stderr=real_stderr,
      start_new_session=True)
  os.close(read_end)
  sys.stderr.flush()
  os.dup2(write_end, stderr_fd)
  os.close(write_end)
  sys.stderr = os.fdopen(real_stderr, 'w', buffering=1,
                         encoding=getattr(sys.stderr, 'encoding', None),
                         errors='backslashreplace')
  _installed = True
  return True
