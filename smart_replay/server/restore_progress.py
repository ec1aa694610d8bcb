"""Progress of a Reverb restore, measured by the bytes this process reads.

`reverb.Server(...)` restores a checkpoint inside its constructor and says
nothing to Python until it is done. The restore reads the checkpoint's files
once, front to back, so the bytes this process has read since it began
(`rchar` in Linux's `/proc/self/io`) measure how far it got: `restoring()`
shows them against the checkpoint's size, with rate and ETA, through
`ProgressLog` (a bar on a terminal, a line every few seconds otherwise).
After the last byte, Reverb still builds the tables in memory; the bar then
stays at 100% until the server answers.
"""

import contextlib
import os
import threading
from typing import Iterator, Optional

from smart_replay.utils import progress_log

_PROC_IO = '/proc/self/io'
_MB = 1_000_000


def bytes_read() -> Optional[int]:
  """Returns the bytes this process has read so far, or None if unknown.

  Returns:
    `rchar` of `/proc/self/io` (every read, cached or not); None where the
    file does not exist.
  """
  try:
    with open(_PROC_IO) as f:
      for line in f:
        if line.startswith('rchar:'):
          return int(line.split()[1])
  except OSError:
    return None
  return None


def checkpoint_bytes(path: str) -> int:
  """Returns the size of the files under a checkpoint folder.

  Args:
    path: a checkpoint folder.

  Returns:
    The total size in bytes (0 if `path` does not exist).
  """
  total = 0
  for root, _, names in os.walk(path):
    for name in names:
      try:
        total += os.path.getsize(os.path.join(root, name))
      except OSError:
        pass  # Removed meanwhile: Reverb will say so.
  return total


@contextlib.contextmanager
def restoring(path: Optional[str], *, interval_s: float = 0.25,
              bar: Optional[bool] = None) -> Iterator[None]:
  """Shows the progress of a restore of `path` while the block runs.

  Args:
    path: the checkpoint folder being restored; None: nothing to show.
    interval_s: seconds between measurements.
    bar: passed to `ProgressLog` (None: a bar on a terminal).

  Yields:
    Nothing; the progress stops when the block ends.
  """
  start = bytes_read()
  total = checkpoint_bytes(path) if path else 0
  if not total or start is None:
    yield
    return
  done = threading.Event()
  label = f'restore {os.path.basename(os.path.normpath(path))}'
  with progress_log.ProgressLog(label, max(1, round(total / _MB)), 'MB',
                                bar=bar) as progress:

    def watch():
      while not done.wait(interval_s):
        read = min(bytes_read() - start, total)
        progress.update(round(read / _MB))

    watcher = threading.Thread(target=watch, name='restore-progress',
                               daemon=True)
    watcher.start()
    try:
      yield
    finally:
      done.set()
      watcher.join()
      progress.update(max(1, round(total / _MB)))
