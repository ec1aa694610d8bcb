"""Files that hold a secret: the user's own, read without following links.

The control token and the control service's private key are read with
`read_private_file` and written with `write_private_file`: a link is never
followed (another user may have planted it), and a file is used only if it
is a regular file of the process's effective user that group and others
cannot read or change. Each refusal names the file, what is wrong and the
fix.
"""

import os
import stat
from typing import Optional

from smart_replay import errors
from smart_replay.storage import durable

_MAX_BYTES = 64 << 10


def ownership_problem(info: os.stat_result) -> Optional[str]:
  """What makes a file unfit to hold a secret of this process, or None.

  Args:
    info: the file's `fstat` (or `lstat`).

  Returns:
    A sentence fragment ('is not a regular file', 'belongs to uid ...',
    'has mode ...') ending with the fix, or None if the file is fit.
  """
  if not stat.S_ISREG(info.st_mode):
    return 'is not a regular file'
  if info.st_uid != os.geteuid():
    return (f'belongs to uid {info.st_uid}, not to this process\'s user '
            f'(uid {os.geteuid()}): another user may have planted it. Use a '
            'file you own')
  mode = stat.S_IMODE(info.st_mode)
  if mode & (stat.S_IRWXG | stat.S_IRWXO):
    return (f'has mode {mode:04o}: group or others can read or change it. '
            'Run `chmod 600` on it')
  return None


def read_private_file(path: str, *, what: str,
                      max_bytes: int = _MAX_BYTES) -> bytes:
  """Reads a secret file that must be the process user's own.

  Args:
    path: the file.
    what: what it is, for messages (e.g. 'the control token file').
    max_bytes: the largest size accepted.

  Returns:
    Its bytes.

  Raises:
    FileNotFoundError: if it does not exist.
    AuthenticationError: if it is a link, not a regular file, another
      user's, open to group or others, larger than `max_bytes`, or
      unreadable (names the path and the fix).
  """
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
  except FileNotFoundError:
    raise
  except OSError as e:
    if os.path.islink(path):
      raise errors.AuthenticationError(
          f'{what} {path} is a symbolic link; links are never followed '
          '(another user may have planted it). Put the file itself there.'
      ) from None
    raise errors.AuthenticationError(
        f'cannot read {what} {path}: {e.strerror or e}.') from None
  with os.fdopen(fd, 'rb') as f:
    problem = ownership_problem(os.fstat(f.fileno()))
    if problem:
      raise errors.AuthenticationError(f'{what} {path} {problem}.')
    data = f.read(max_bytes + 1)
  if len(data) > max_bytes:
    raise errors.AuthenticationError(
        f'{what} {path} holds more than {max_bytes} bytes: it is not one.')
  return data


def write_private_file(path: str, data: bytes, *,
                       replace: bool = False) -> None:
  """Writes a secret file (mode 0600) at once: readers see all or nothing.

  The data goes to a new file beside `path` (created exclusively, links not
  followed), is synced, and is renamed into place; the folder is synced.

  Args:
    path: the file to write.
    data: its bytes.
    replace: False refuses an existing `path`; True replaces it (callers
      check first that it is theirs).

  Raises:
    FileExistsError: if `path` exists and `replace` is False.
    OSError: if it cannot be written.
  """
  if not replace and os.path.lexists(path):
    raise FileExistsError(f'{path} exists.')
  partial = f'{path}.{os.getpid()}.partial'
  fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
               0o600)
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    if replace:
      os.replace(partial, path)
    else:
      os.link(partial, path)  # Fails if another process made it meanwhile.
      os.unlink(partial)
  except BaseException:
    if os.path.lexists(partial):
      os.unlink(partial)
    raise
  durable.fsync_dir(os.path.dirname(os.path.abspath(path)))
