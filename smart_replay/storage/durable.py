"""Durable file operations: fsync, crash-safe removal, a bounded set-aside folder.

A rename is atomic but not durable until its directory is fsynced, and Reverb
writes its checkpoint files without fsync. A checkpoint only counts as
committed once its files, its folder and the folder holding it are fsynced
(`fsync_tree`, `fsync_dir`), so a power cut cannot leave a committed name
pointing at data that never reached the disk.

Removing a folder is not atomic either: a kill in the middle of `rmtree`
leaves half a folder. `remove_tree` first renames it to a `.deleting-` name,
which `remove_interrupted_deletions` finishes after a crash, so a half-deleted
checkpoint is never mistaken for a damaged one.

`set_aside` moves something that is not a committed checkpoint (an interrupted
save, a damaged checkpoint) into `<root>/orphaned/` for inspection, and keeps
only the newest `keep_orphaned` entries there, so repeated crashes cannot fill
the disk.

Nothing here follows a symbolic link: entries are looked at with `lstat`, a
link found where a folder is deleted is removed itself (never what it points
to), and a folder that holds what is deleted (`orphaned/`, `checkpoints/`)
must be a real folder, not a link another user planted
(`errors.UnsafeBufferDirError` otherwise, see `ownership`).
"""

import os
import shutil
import stat
import time
from typing import List, Optional

from absl import logging

from smart_replay.storage import ownership

ORPHANED_DIR = 'orphaned'
# Entries `orphaned/` keeps (the newest); older ones are deleted.
KEEP_ORPHANED = 2
_DELETING = '.deleting-'


def fsync_dir(path: str) -> None:
  """Makes the entries of directory `path` (renames, new files) durable.

  Args:
    path: a directory.

  Raises:
    OSError: if the directory cannot be opened or synced.
  """
  fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def fsync_tree(path: str) -> None:
  """Fsyncs every file under `path`, then every directory, bottom up.

  Args:
    path: a directory (e.g. a checkpoint folder Reverb just wrote).

  Raises:
    OSError: if a file cannot be read or synced (e.g. an I/O error).
  """
  for folder, _, files in os.walk(path, topdown=False):  # Links not followed.
    for name in files:
      if os.path.islink(os.path.join(folder, name)):
        continue  # Not ours to sync (Reverb writes no links).
      fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
    fsync_dir(folder)


def remove_tree(path: str) -> None:
  """Deletes the folder `path` so that a crash midway leaves no half folder.

  The folder is renamed to `.deleting-<name>` beside it first (atomic); a
  crash during the deletion leaves only that name, which
  `remove_interrupted_deletions` removes later. A link at `path` is removed
  itself; what it points to is left alone.

  Args:
    path: a folder; nothing happens if it does not exist.

  Raises:
    UnsafeBufferDirError: if the folder holding `path` is a symbolic link.
    OSError: if the rename fails.
  """
  parent, name = os.path.split(os.path.normpath(os.path.abspath(path)))
  if not ownership.real_folder(parent):
    return
  try:
    info = os.lstat(path)
  except FileNotFoundError:
    return
  if not stat.S_ISDIR(info.st_mode):  # A link (or a file): remove just it.
    os.remove(path)
    return
  doomed = os.path.join(parent, _DELETING + name)
  os.replace(path, doomed)
  shutil.rmtree(doomed, ignore_errors=True)  # Never follows links inside.


def remove(path: Optional[str]) -> None:
  """Removes a file, or a folder with `remove_tree`; nothing if missing.

  A link is removed itself, never what it points to.

  Args:
    path: what to remove, or None.

  Raises:
    UnsafeBufferDirError: if the folder holding `path` is a symbolic link.
    OSError: if the removal fails.
  """
  if path:
    remove_tree(path)


def remove_interrupted_deletions(folder: str) -> List[str]:
  """Finishes deletions a crash interrupted (see `remove_tree`).

  Args:
    folder: the folder that held the deleted entries.

  Returns:
    The paths removed.

  Raises:
    UnsafeBufferDirError: if `folder` is a symbolic link.
  """
  removed = []
  if ownership.real_folder(folder):
    for name in os.listdir(folder):
      if name.startswith(_DELETING):
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
          shutil.rmtree(path, ignore_errors=True)
        else:  # A link (removed itself, never followed) or a file.
          try:
            os.remove(path)
          except FileNotFoundError:
            continue
        removed.append(path)
  return removed


def set_aside(root: str, path: str, *, reason: str,
              keep_orphaned: int = KEEP_ORPHANED) -> str:
  """Moves `path` into `<root>/orphaned/` and bounds that folder.

  The entry keeps its name (with `.2`, `.3`, ... if taken). Afterwards only
  the `keep_orphaned` most recently set-aside entries stay; older ones are
  deleted with a log line.

  Args:
    root: the buffer directory.
    path: what to move (file or folder).
    reason: why, for the log line.
    keep_orphaned: entries `orphaned/` keeps (>= 1).

  Returns:
    Where `path` now is.

  Raises:
    UnsafeBufferDirError: if `<root>/orphaned` is a symbolic link.
    OSError: if the move fails.
  """
  aside = ownership.private_dir(os.path.join(root, ORPHANED_DIR))
  name = os.path.basename(os.path.normpath(path))
  target, suffix = os.path.join(aside, name), 1
  while os.path.lexists(target):
    suffix += 1
    target = os.path.join(aside, f'{name}.{suffix}')
  os.replace(path, target)
  now = time.time()
  # Its time in orphaned/ is when it came.
  os.utime(target, (now, now), follow_symlinks=False)
  logging.warning('Moved %s to %s: %s.', path, target, reason)
  bound_orphaned(root, keep_orphaned=keep_orphaned)
  return target


def bound_orphaned(root: str, *, keep_orphaned: int = KEEP_ORPHANED
                   ) -> List[str]:
  """Deletes all but the newest `keep_orphaned` entries of `<root>/orphaned/`.

  Args:
    root: the buffer directory.
    keep_orphaned: entries to keep (>= 1).

  Returns:
    The paths deleted (a link among them is removed itself).

  Raises:
    UnsafeBufferDirError: if `<root>/orphaned` is a symbolic link.
  """
  aside = os.path.join(root, ORPHANED_DIR)
  if not ownership.real_folder(aside):
    return []
  remove_interrupted_deletions(aside)
  entries = sorted((os.path.join(aside, n) for n in os.listdir(aside)),
                   key=lambda p: os.lstat(p).st_mtime, reverse=True)
  deleted = entries[keep_orphaned:]
  for path in deleted:
    remove(path)
  if deleted:
    logging.info('Deleted %d old entr%s of %s (it keeps the newest %d): %s',
                 len(deleted), 'y' if len(deleted) == 1 else 'ies', aside,
                 keep_orphaned, deleted)
  return deleted
