"""Shared behaviour of the command-line binaries: signals and exit codes.

The binaries stop gracefully on the first SIGINT/SIGTERM (in
`smart-replay-populate` and `smart-replay-train` a final checkpoint follows;
the read-only `smart-replay-inspect` writes none), quit at once on the
second, report bad input as `error: ...` with exit code 2, and ignore late
signals once the work is done so the exit code stays what it should be.
"""

import re
import signal
import sys
import traceback
from typing import Any, Callable, Iterable, Optional, Tuple

from absl import logging

from smart_replay import errors

EXIT_BAD_INPUT = 2

# What the first signal does in a binary that writes a final checkpoint when
# it stops (%d: the signal number).
FINAL_CHECKPOINT_STOP = (
    'Signal %d: stopping after this step and writing a final checkpoint '
    '(send it again to quit at once; the last completed checkpoint stays '
    'loadable).')


class StopRequest:
  """Turns SIGINT/SIGTERM into a graceful stop, and a second one into a quit.

  Install `handle` as the signal handler and pass the object itself as
  `stop_requested`: the first signal asks the work to stop at its next
  stopping point (`message` says what follows, e.g. a final checkpoint); a
  second one raises `KeyboardInterrupt` to quit at once.

  Args:
    message: logged at the first signal, with `%d` for the signal number.

  Attributes:
    signal: the number of the first signal received, or None.
    message: what the first signal logs.
  """

  def __init__(self, message: str = FINAL_CHECKPOINT_STOP):
    self.signal = None
    self.message = message

  def __call__(self) -> bool:
    """Tells whether a stop was requested.

    Returns:
      True once a signal arrived.
    """
    return self.signal is not None

  def handle(self, signum: int, frame=None) -> None:
    """Signal handler.

    Args:
      signum: the signal number.
      frame: unused (the interrupted stack frame).

    Raises:
      KeyboardInterrupt: on the second signal.
    """
    del frame
    if self.signal is not None:
      raise KeyboardInterrupt
    self.signal = signum
    logging.warning(self.message, signum)


def interrupted_exit_code(stop: StopRequest) -> int:
  """Returns 128 + the signal number (the shell's convention).

  Args:
    stop: the request that ended the work.

  Returns:
    The exit code; 130 (SIGINT) if no signal was recorded.
  """
  return 128 + (stop.signal or signal.SIGINT)


def as_flags(message: str, names: Iterable[str]) -> str:
  """Spells the function arguments a library message names as flags.

  `resume=True` becomes `--resume`, `resume=False` `--noresume`, and
  `name=...` `--name=...`, for each of `names`.

  Args:
    message: an error message naming function arguments.
    names: the arguments that are also flags of the binary.

  Returns:
    The message as a command-line user reads it.
  """
  # Gin appends where a configurable was called; the binary's user did not
  # call it.
  message = re.sub(r'\n\s*In call to configurable [^\n]*', '', message)
  for name in names:
    unflagged = rf'(?<![\w-]){re.escape(name)}='
    message = re.sub(unflagged + r'True\b', f'--{name}', message)
    message = re.sub(unflagged + r'False\b', f'--no{name}', message)
    message = re.sub(unflagged, f'--{name}=', message)
  return message


def run_stoppable(work: Callable[[StopRequest], Any], *, quit_message: str,
                  flag_names: Iterable[str] = (), verbose: bool = False,
                  stop_message: str = FINAL_CHECKPOINT_STOP
                  ) -> Tuple[Optional[Any], Optional[int], StopRequest]:
  """Runs `work(stop)` with SIGINT/SIGTERM turned into a `StopRequest`.

  Args:
    work: called with the `StopRequest` to poll (pass it as
      `stop_requested`).
    quit_message: printed to stderr when `work` ends with
      `KeyboardInterrupt` (a second signal, or a stop it made).
    flag_names: arguments of `work`'s library call that are flags of the
      binary; error messages name them as flags (see `as_flags`).
    verbose: print the traceback of a bad-input error before its line.
    stop_message: logged at the first signal (`%d`: its number); the
      default promises a final checkpoint, so a binary that writes none
      passes its own.

  Returns:
    `(result, exit_code, stop)`: `exit_code` is None when `work` returned
    (the caller decides, e.g. from `stop.signal`), else the code to exit with
    after the error was printed: 2 for bad input or an unusable path, 128 +
    signal after a quit.
  """
  stop = StopRequest(stop_message)
  signal.signal(signal.SIGINT, stop.handle)
  signal.signal(signal.SIGTERM, stop.handle)
  try:
    return work(stop), None, stop
  except (ValueError, errors.SmartReplayError) as e:
    if verbose:
      traceback.print_exc()
    print(f'error: {as_flags(str(e), flag_names)}', file=sys.stderr)
    return None, EXIT_BAD_INPUT, stop
  except OSError as e:
    if verbose:
      traceback.print_exc()
    where = f'cannot use {e.filename!r}: ' if e.filename else ''
    print(f'error: {where}{as_flags(str(e.strerror or e), flag_names)}',
          file=sys.stderr)
    return None, EXIT_BAD_INPUT, stop
  except KeyboardInterrupt:
    print(quit_message, file=sys.stderr)
    return None, interrupted_exit_code(stop), stop
  finally:
    # Nothing is left to interrupt: a late signal must not change the exit.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
