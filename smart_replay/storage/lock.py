"""One writer per buffer directory: an OS-level lock on `<buffer>/.lock`.

Two managers writing checkpoints into one directory would number, prune and
restore each other's checkpoints. `BufferLock` takes an exclusive `flock` on
`<buffer>/.lock` when a manager starts (create, load, serve) and releases it on
`close()`. The kernel drops the lock when the holding process dies, `kill -9`
included, so a crash never leaves a stale lock; the file itself stays (it only
records the holder: pid, host and time, for the error message).

`flock` locks belong to an open file, so a second manager in the same process
is refused too. Reading a buffer (`load_replay_buffer(source=...)` of a starter
buffer, `smart-replay-inspect`, exports) takes no lock: any number of
processes may read a buffer while one writes it. On network file systems
`flock` may not be enforced across machines (NFS before v4 locks only
locally): keep one buffer directory per machine.
"""

import datetime
import fcntl
import json
import os
import socket
from typing import Any, Dict, Optional

from absl import logging

from smart_replay import errors
from smart_replay.storage import ownership

LOCK_FILE = '.lock'


def read_holder(directory: str) -> Dict[str, Any]:
  """What the holder of `directory`'s lock recorded (empty if unknown).

  Args:
    directory: a buffer directory.

  Returns:
    `{'pid': int, 'host': str, 'since': str}`, or `{}` if the file is
    missing or unreadable.
  """
  try:
    with open(os.path.join(directory, LOCK_FILE)) as f:
      holder = json.load(f)
    return holder if isinstance(holder, dict) else {}
  except (OSError, ValueError):
    return {}


class BufferLock:
  """An exclusive, crash-safe lock on one buffer directory.

  Use as a context manager or call `acquire()` / `release()`.

  Args:
    directory: the buffer directory (created, mode 0700, if missing).

  Raises:
    ValueError: if `directory` is empty.
  """

  def __init__(self, directory: str):
    if not directory:
      raise ValueError(f'directory must be a non-empty path, got '
                       f'{directory!r}.')
    self._directory = os.path.abspath(directory)
    self._fd: Optional[int] = None

  @property
  def path(self) -> str:
    """The lock file."""
    return os.path.join(self._directory, LOCK_FILE)

  @property
  def held(self) -> bool:
    """True while this object holds the lock."""
    return self._fd is not None

  def acquire(self) -> 'BufferLock':
    """Takes the lock without waiting.

    Returns:
      The lock itself.

    Raises:
      BufferInUseError: if another manager (any process, this one included)
        holds it; names the holder's pid, host and start time.
      UnsafeBufferDirError: if another user could change the directory
        (`ownership.own_buffer_dir`; names it and the fix).
      OSError: if the directory or lock file cannot be created.
    """
    if self._fd is not None:
      return self
    ownership.own_buffer_dir(self._directory)  # Checked again at each start.
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      holder = read_holder(self._directory)
      who = (f"process {holder.get('pid', '?')} on host "
             f"{holder.get('host', '?')} (since {holder.get('since', '?')})"
             if holder else 'another process (holder not recorded yet)')
      same = holder.get('pid') == os.getpid() and (
          holder.get('host') == socket.gethostname())
      raise errors.BufferInUseError(
          f'the buffer directory {self._directory} is open in {who}'
          + (' — another ReplayBufferManager of this process' if same else '')
          + '. One manager writes a buffer at a time: close() the other one '
          'first, or use another checkpoint_dir (to train from this buffer '
          "without writing to it, load_replay_buffer(source='"
          f"{self._directory}') from a manager with its own checkpoint_dir).",
          holder) from None
    holder = {'pid': os.getpid(), 'host': socket.gethostname(),
              'since': datetime.datetime.now(datetime.timezone.utc)
                       .isoformat(timespec='seconds')}
    self._fd = fd
    try:
      os.ftruncate(fd, 0)
      os.write(fd, json.dumps(holder).encode())
    except OSError as e:  # E.g. a full disk: the lock itself is held.
      logging.warning('Holding the lock on %s, but could not record the '
                      'holder in %s: %s', self._directory, self.path, e)
    return self

  def release(self) -> None:
    """Releases the lock; safe to call more than once."""
    if self._fd is None:
      return
    fd, self._fd = self._fd, None
    try:
      fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
      os.close(fd)

  def __enter__(self) -> 'BufferLock':
    """Acquires the lock (see `acquire`)."""
    return self.acquire()

  def __exit__(self, exc_type, exc_value, traceback) -> None:
    """Releases the lock."""
    self.release()
