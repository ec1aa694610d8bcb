"""Who owns a buffer folder: this process's user, and nobody else can change it.

A buffer folder holds what its server trusts and deletes: the control token,
the checkpoints, and `orphaned/`, whose old entries it removes. Another Unix
user who created the folder, or who can write to it or to a folder above it,
could plant a token of their own, or a link that makes the server delete
files elsewhere. So a buffer folder is owned the way sshd's StrictModes owns
`~/.ssh` (`own_buffer_dir`, at every open):

* it is created, with any missing parents, with mode 0700 whatever the umask;
* it must be a real folder (not a symbolic link), owned by the process's
  effective user (`os.geteuid()`), and not writable by group or others; a
  folder that group or others can only read is used, with one warning
  (`chmod 700`);
* every folder above it, up to `/`, must be owned by root or that user, and
  not writable by group or others unless its sticky bit is set (like /tmp);
  a link on the way must be owned by root or that user too;
* the entries the buffer uses (`KNOWN_ENTRIES`) must not be symbolic links,
  and must be owned by that user (or root).

The buffer's own subfolders (`checkpoints/`, `.reverb/`, `orphaned/`, ...) are
made with `private_dir` (mode 0700; a link in their place is refused), and
`real_folder` tells the storage layer whether a subfolder exists, refusing a
link, before it deletes anything inside. Each refusal is an
`UnsafeBufferDirError` naming the path, what is wrong and the fix.
"""

import os
import pwd
import stat
from typing import Iterator, Optional, Set

from absl import logging

from smart_replay import errors

# The fixed names the buffer folder holds: storage's own (checkpoint_folders,
# durable, coordinated_records, lock, the observers' journals), the control service's secrets
# (control/: the tokens and its certificate with its key) and the serving
# record (remote/serving_record). test_ownership.py checks they agree. A link
# under any of them could make the server read, write or delete elsewhere.
KNOWN_ENTRIES = ('checkpoints', '.reverb', 'orphaned', '.replaced',
                 'coordinated', 'journal', '.lock', 'control.token', 'reader.token',
                 'control.pem', '.serving.json', '.serving.json.tmp')
PRIVATE_MODE = 0o700
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
# Folders already warned about as readable by others (one line per process).
_warned: Set[str] = set()


def own_buffer_dir(path: str, *, create: bool = True) -> str:
  """Makes `path` a buffer folder only this process's user can change.

  Creates it (and missing parents) with mode 0700 whatever the umask, then
  checks it, each folder above it and its known entries (see the module
  docstring). A folder group or others can read gets one warning line.

  Args:
    path: the buffer folder (`checkpoint_dir`).
    create: False checks what exists and makes nothing (e.g. when a buffer
      is configured, before anything is written: a start that fails then
      leaves no folder behind).

  Returns:
    Its absolute path.

  Raises:
    ValueError: if `path` is empty.
    UnsafeBufferDirError: if it, a folder above it or one of its known
      entries could be changed by another user (names the path, what is
      wrong and the fix).
    NotADirectoryError: if `path` is a file.
    OSError: if a folder cannot be made.
  """
  if not path:
    raise ValueError(f'checkpoint_dir must be a non-empty path, got {path!r}.')
  folder = os.path.normpath(os.path.abspath(path))
  above = os.path.dirname(folder)
  for parent in _top_down(above):
    info = _made_or_found(parent, folder, create=create)
    if info is None:
      return folder  # Nothing below it exists yet.
    _check_above(parent, folder, info)
  real_above = os.path.realpath(above)
  if real_above != above:  # A link on the way: check where it leads too.
    for parent in _top_down(real_above):
      _check_above(parent, folder, os.lstat(parent))
  info = _made_or_found(folder, folder, create=create)
  if info is None:
    return folder
  _check_folder(folder, info)
  for name in KNOWN_ENTRIES:
    _check_entry(folder, name)
  return folder


def private_dir(path: str) -> str:
  """Makes one of the buffer's own folders (mode 0700), refusing a link.

  An existing folder is kept as it is. The folder holding it must exist and
  be a real folder (not a link): make nested folders one at a time.

  Args:
    path: e.g. `<buffer>/orphaned`.

  Returns:
    `path`.

  Raises:
    UnsafeBufferDirError: if `path`, or the folder holding it, is a
      symbolic link.
    FileNotFoundError: if the folder holding it is missing (or a file).
    NotADirectoryError: if `path` is a file.
    OSError: if it cannot be made.
  """
  parent = os.path.dirname(os.path.normpath(os.path.abspath(path)))
  if not real_folder(parent):
    raise FileNotFoundError(f'cannot make {path}: {parent} is not a folder.')
  if not os.path.lexists(path):
    _made_or_found(path, path)
  if not real_folder(path):
    raise NotADirectoryError(f'{path} is not a folder; move it away.')
  return path


def real_folder(path: str) -> bool:
  """Tells whether `path` is a folder, refusing a link in its place.

  Storage code asks this before it lists or deletes inside `path`, so it
  never works through a link another user planted.

  Args:
    path: a folder of the buffer, e.g. `<buffer>/orphaned`.

  Returns:
    True if it is a folder (not a link); False if nothing, or something
    other than a folder or a link (a file), is there.

  Raises:
    UnsafeBufferDirError: if it is a symbolic link.
  """
  try:
    info = os.lstat(path)
  except (FileNotFoundError, NotADirectoryError):
    return False
  if stat.S_ISLNK(info.st_mode):
    raise _symlink_error(path)
  return stat.S_ISDIR(info.st_mode)


def _top_down(folder: str) -> Iterator[str]:
  """`/`, then each folder on the way down to `folder` (included)."""
  parts = [p for p in folder.split(os.sep) if p]
  yield os.sep
  for i in range(1, len(parts) + 1):
    yield os.sep + os.path.join(*parts[:i])


def _made_or_found(folder: str, buffer_dir: str, *,
                   create: bool = True) -> Optional[os.stat_result]:
  """`lstat` of `folder`, made with mode 0700 (exactly) if missing; None if
  missing and not `create`."""
  try:
    return os.lstat(folder)
  except FileNotFoundError:
    if not create:
      return None
  try:
    os.mkdir(folder, PRIVATE_MODE)  # The umask can only clear bits.
  except FileExistsError:  # Made meanwhile (by whom is checked next).
    return os.lstat(folder)
  except NotADirectoryError:
    raise NotADirectoryError(
        f'cannot make {folder} for the buffer folder {buffer_dir}: a file is '
        'on the way.') from None
  fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
  try:
    info = os.fstat(fd)
    if info.st_uid == os.geteuid():
      os.fchmod(fd, PRIVATE_MODE)  # 0700 also under a umask such as 0277.
  finally:
    os.close(fd)
  return os.lstat(folder)


def _check_above(parent: str, buffer_dir: str, info: os.stat_result) -> None:
  """Refuses a folder (or link) above the buffer that others could change."""
  if info.st_uid not in (0, os.geteuid()):
    raise _error(
        buffer_dir,
        f'{_kind(info)} {parent} above it belongs to {_user(info.st_uid)}, '
        f'not to root or this process\'s user ({_user(os.geteuid())}): that '
        'user could rename or replace the buffer folder',
        'choose a folder under folders that only you (or root) own')
  mode = stat.S_IMODE(info.st_mode)
  if (not stat.S_ISLNK(info.st_mode) and mode & _WRITABLE_BY_OTHERS
      and not mode & stat.S_ISVTX):
    raise _error(
        buffer_dir,
        f'the folder {parent} above it has mode {mode:04o}: group or others '
        'can write to it (and it has no sticky bit, as /tmp has), so another '
        'user could rename or replace the buffer folder',
        f'run `chmod go-w {parent}` (or `chmod +t {parent}` for a shared '
        'folder), or choose a folder under folders only you can write')


def _check_folder(folder: str, info: os.stat_result) -> None:
  """Refuses a buffer folder that is a link, another user's or writable by
  others; warns once about one that others can read."""
  if stat.S_ISLNK(info.st_mode):
    raise _error(
        folder, f'it is a symbolic link (to {_link_target(folder)!r}), which '
        'whoever can write next to it could point elsewhere',
        'pass the real folder (if you own it), or choose a folder you own')
  if not stat.S_ISDIR(info.st_mode):
    raise NotADirectoryError(
        f'checkpoint_dir {folder} is a file, not a folder; choose another '
        'path.')
  if info.st_uid != os.geteuid():
    raise _error(
        folder, f'it belongs to {_user(info.st_uid)}, not to this process\'s '
        f'user ({_user(os.geteuid())}): its owner could plant a control '
        'token or links in it',
        'choose a folder you own (or run as its owner)')
  mode = stat.S_IMODE(info.st_mode)
  if mode & _WRITABLE_BY_OTHERS:
    raise _error(
        folder, f'it has mode {mode:04o}: group or others can write to it, so '
        'another user could have planted a control token or links in it',
        f'check what is in it, then run `chmod go-w {folder}` (or `chmod 700 '
        f'{folder}`), or choose a new folder you own')
  if mode & (stat.S_IRWXG | stat.S_IRWXO) and folder not in _warned:
    _warned.add(folder)
    logging.warning(
        'The buffer folder %s has mode %04o: group or others can read its '
        'checkpoints (every stored item). Run `chmod 700 %s`.', folder, mode,
        folder)


def _check_entry(folder: str, name: str) -> None:
  """Refuses a known entry of the buffer that is a link or another user's."""
  path = os.path.join(folder, name)
  try:
    info = os.lstat(path)
  except FileNotFoundError:
    return
  if stat.S_ISLNK(info.st_mode):
    raise _symlink_error(path)
  if info.st_uid not in (0, os.geteuid()):
    raise _error(
        folder, f'its entry {path} belongs to {_user(info.st_uid)}, not to '
        f'this process\'s user ({_user(os.geteuid())}): another user planted '
        'it',
        f'check it, then remove it (`rm -r {path}`), or choose a new folder '
        'you own')


def _symlink_error(path: str) -> errors.UnsafeBufferDirError:
  """The refusal of a link where the buffer keeps an entry of its own."""
  return errors.UnsafeBufferDirError(
      f'refusing {path} in a buffer folder: it is a symbolic link (to '
      f'{_link_target(path)!r}), and links there are never followed (another '
      'user may have planted it to make the server read, write or delete '
      f'elsewhere). Fix: check it, then remove the link (`rm {path}`), or '
      'choose a new folder you own.', os.path.dirname(path))


def _error(folder: str, problem: str, fix: str) -> errors.UnsafeBufferDirError:
  return errors.UnsafeBufferDirError(
      f'refusing the buffer folder {folder}: {problem}. Fix: {fix}.', folder)


def _kind(info: os.stat_result) -> str:
  return 'the link' if stat.S_ISLNK(info.st_mode) else 'the folder'


def _link_target(path: str) -> str:
  try:
    return os.readlink(path)
  except OSError:
    return '?'


def _user(uid: int) -> str:
  """'uid 1000 (alice)', or 'uid 1000' if it has no name."""
  try:
    return f'uid {uid} ({pwd.getpwuid(uid).pw_name})'
  except KeyError:
    return f'uid {uid}'
