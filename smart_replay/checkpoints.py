"""Safe checkpoint storage around Reverb's checkpointer.

Reverb keeps only the newest folder *by name* in its checkpoint root and deletes
everything else there, names folders in local time, and restores silently from
any root it is pointed at. So a buffer directory is laid out as::

    <checkpoint_dir>/
      checkpoints/ckpt-000001/   complete checkpoints: Reverb files + manifest.json
      checkpoints/ckpt-000002/
      .reverb/                   Reverb's own root; empty between saves
      orphaned/                  leftovers of interrupted saves, moved aside, never deleted
      .replaced/                 only during an overwrite: the old data, until the
                                 new buffer is up (then deleted) or it failed (restored)

After each save the new Reverb folder is verified, moved out of `.reverb/` into
`checkpoints/` under a monotonically numbered name, and its manifest is written
beside it; only then is it visible as a checkpoint. Pruning (keep the last K)
is ours, by number, never by timestamp.
"""

import os
import re
import shutil
from typing import Callable, List, Optional, Tuple

from absl import logging

from smart_replay import checkpoint_files
from smart_replay import errors
from smart_replay import manifest as manifest_lib

CHECKPOINTS_DIR = 'checkpoints'
REVERB_DIR = '.reverb'
ORPHANED_DIR = 'orphaned'
REPLACED_DIR = '.replaced'
_NAME = re.compile(r'^ckpt-(\d{6,})$')
_INCOMING = '.incoming-'


def checkpoint_name(number: int) -> str:
  """Returns the folder name of a checkpoint.

  Args:
    number: the checkpoint's sequence number.

  Returns:
    e.g. 'ckpt-000003'.
  """
  return f'ckpt-{number:06d}'


def checkpoint_number(path: str) -> Optional[int]:
  """Returns N for a folder named ckpt-N.

  Args:
    path: a folder name or path.

  Returns:
    The number, or None if the name is not ckpt-N.
  """
  match = _NAME.match(os.path.basename(os.path.normpath(path)))
  return int(match.group(1)) if match else None


def verify(path: str) -> dict:
  """Checks that `path` is a complete, unchanged smart_replay checkpoint.

  Args:
    path: a checkpoint folder (e.g. `.../checkpoints/ckpt-000003`).

  Returns:
    The checkpoint's manifest.

  Raises:
    CheckpointCorruptError: if the manifest is missing or unreadable, or a
      Reverb file is missing or differs from the digest in the manifest; the
      message lists each problem.
  """
  manifest_path = os.path.join(path, manifest_lib.MANIFEST_NAME)
  try:
    manifest = manifest_lib.read(manifest_path)
  except (OSError, ValueError) as e:
    raise errors.CheckpointCorruptError(
        f'checkpoint {path} has no readable manifest: {e}') from e
  problems = checkpoint_files.digest_mismatches(path, manifest.get('files', {}))
  if problems:
    raise errors.CheckpointCorruptError(
        f'checkpoint {path} is damaged: ' + '; '.join(problems))
  return manifest


def buffer_dir_of(checkpoint: str) -> str:
  """Returns the buffer directory holding a `checkpoints/ckpt-N` folder.

  Args:
    checkpoint: a checkpoint folder.

  Returns:
    The directory two levels up.

  Raises:
    ValueError: if `checkpoint` is not inside a `checkpoints/` folder.
  """
  parent = os.path.dirname(os.path.abspath(checkpoint))
  if os.path.basename(parent) != CHECKPOINTS_DIR:
    raise ValueError(f'{checkpoint} is not inside a {CHECKPOINTS_DIR}/ folder; '
                     'pass checkpoint_dir explicitly.')
  return os.path.dirname(parent)


def find_checkpoints(source: str) -> List[str]:
  """Lists the checkpoints a load from `source` may use, newest first.

  Args:
    source: a buffer directory (holding `checkpoints/`) or one specific
      checkpoint folder (holding `manifest.json`).

  Returns:
    Checkpoint folder paths, newest first. A specific folder gives one entry.

  Raises:
    CheckpointNotFoundError: if `source` does not exist or holds no checkpoint;
      the message names the path and what was looked for.
  """
  source = os.path.abspath(source)
  if not os.path.isdir(source):
    raise errors.CheckpointNotFoundError(
        f'no checkpoint to load: {source} does not exist. Expected a buffer '
        f'directory holding {CHECKPOINTS_DIR}/ckpt-NNNNNN folders, or one such '
        'folder.')
  if (os.path.isfile(os.path.join(source, manifest_lib.MANIFEST_NAME)) or
      checkpoint_files.is_reverb_checkpoint(source)):
    return [source]
  folder = os.path.join(source, CHECKPOINTS_DIR)
  found = []
  if os.path.isdir(folder):
    numbered = [(checkpoint_number(n), n) for n in os.listdir(folder)]
    found = [os.path.join(folder, n)
             for num, n in sorted((x for x in numbered if x[0] is not None),
                                  reverse=True)]
  if not found:
    raise errors.CheckpointNotFoundError(
        f'no checkpoint to load in {source}: expected {CHECKPOINTS_DIR}/'
        'ckpt-NNNNNN folders written by ReplayBufferManager.checkpoint() (or '
        'the path of one such folder). Use create_replay_buffer() to start an '
        'empty buffer.')
  return found


def newest_verified(source: str):
  """`(path, manifest)` of the newest checkpoint at `source` that verifies.

  Args:
    source: a buffer directory or one checkpoint folder.

  Returns:
    The checkpoint folder and its manifest.

  Raises:
    CheckpointNotFoundError: if there is no checkpoint at `source`.
    CheckpointCorruptError: if none verifies; lists why.
  """
  problems = []
  for path in find_checkpoints(source):
    try:
      return path, verify(path)
    except errors.CheckpointCorruptError as e:
      problems.append(str(e))
  raise errors.CheckpointCorruptError(
      f'no checkpoint in {source} verifies: ' + ' | '.join(problems))


class CheckpointStore:
  """The checkpoint layout of one buffer directory (see module docstring).

  Args:
    root: the buffer's `checkpoint_dir`.
    keep: how many complete checkpoints to keep (>= 1).

  Raises:
    ValueError: if `keep` < 1 or `root` is empty.
  """

  def __init__(self, root: str, *, keep: int = 2):
    if not root:
      raise ValueError(f'checkpoint_dir must be a non-empty path, got {root!r}.')
    if not isinstance(keep, int) or keep < 1:
      raise ValueError(f'keep_checkpoints must be an integer >= 1, got {keep!r}.')
    self.root = os.path.abspath(root)
    self.keep = keep

  @property
  def reverb_root(self) -> str:
    """Reverb's own checkpoint root; empty between saves."""
    return os.path.join(self.root, REVERB_DIR)

  @property
  def checkpoints_dir(self) -> str:
    """The folder holding the complete `ckpt-N` checkpoints."""
    return os.path.join(self.root, CHECKPOINTS_DIR)

  def checkpoints(self) -> List[str]:
    """Returns the `ckpt-N` folders, oldest first (complete or not)."""
    if not os.path.isdir(self.checkpoints_dir):
      return []
    numbered = sorted((checkpoint_number(n), n)
                      for n in os.listdir(self.checkpoints_dir)
                      if checkpoint_number(n) is not None)
    return [os.path.join(self.checkpoints_dir, n) for _, n in numbered]

  def existing_data(self) -> List[str]:
    """Lists whatever in `root` a new buffer would shadow or Reverb would load.

    Returns:
      Paths of our checkpoints, of anything in Reverb's root, and of Reverb
      checkpoint folders placed directly in `root` (a raw Reverb root).
    """
    found = list(self.checkpoints())
    if os.path.isdir(self.reverb_root):
      found += [os.path.join(self.reverb_root, n)
                for n in os.listdir(self.reverb_root)]
    if os.path.isdir(self.root):
      found += [os.path.join(self.root, n) for n in os.listdir(self.root)
                if checkpoint_files.is_reverb_checkpoint(
                    os.path.join(self.root, n))]
    return found

  def set_aside(self) -> List[Tuple[str, str]]:
    """Moves everything `existing_data()` lists into `<root>/.replaced/`.

    Used by `overwrite=True`: the old data stays recoverable until the new
    buffer is up (`discard_set_aside`), and is put back if starting it fails
    (`restore_set_aside`).

    Returns:
      The `(original, moved_to)` path pairs.

    Raises:
      FileExistsError: if a `.replaced/` folder from an earlier interrupted
        overwrite is still there (inspect it, then delete it).
    """
    aside = os.path.join(self.root, REPLACED_DIR)
    if os.path.exists(aside):
      raise FileExistsError(
          f'{aside} holds data set aside by an interrupted overwrite; move or '
          'delete it before overwriting again.')
    moves = []
    for path in self.existing_data():
      target = os.path.join(aside, os.path.relpath(path, self.root))
      os.makedirs(os.path.dirname(target), exist_ok=True)
      os.replace(path, target)
      moves.append((path, target))
    return moves

  def restore_set_aside(self, moves: List[Tuple[str, str]]) -> None:
    """Puts back what `set_aside` moved (after a failed overwrite).

    Args:
      moves: what `set_aside` returned.
    """
    for original, moved_to in reversed(moves):
      os.makedirs(os.path.dirname(original), exist_ok=True)
      os.replace(moved_to, original)
    shutil.rmtree(os.path.join(self.root, REPLACED_DIR), ignore_errors=True)

  def discard_set_aside(self, moves: List[Tuple[str, str]]) -> None:
    """Deletes what `set_aside` moved (after a successful overwrite).

    Args:
      moves: what `set_aside` returned.
    """
    if moves:
      logging.warning('overwrite=True: deleted the previous buffer data: %s',
                      [original for original, _ in moves])
    shutil.rmtree(os.path.join(self.root, REPLACED_DIR), ignore_errors=True)

  def prepare_reverb_root(self) -> str:
    """Makes Reverb's root exist and be empty, moving leftovers aside.

    A leftover is a save interrupted before it was moved out (or a file someone
    put there); it is moved to `orphaned/` with a warning, never deleted, so
    Reverb cannot silently restore it.

    Returns:
      The Reverb root path.
    """
    os.makedirs(self.reverb_root, exist_ok=True)
    for name in os.listdir(self.reverb_root):
      os.makedirs(os.path.join(self.root, ORPHANED_DIR), exist_ok=True)
      target = os.path.join(self.root, ORPHANED_DIR, name)
      logging.warning('Moving leftover %s out of Reverb\'s checkpoint root to '
                      '%s (it was never committed as a checkpoint).',
                      os.path.join(self.reverb_root, name), target)
      os.replace(os.path.join(self.reverb_root, name), target)
    return self.reverb_root

  def commit(self, reverb_path: str,
             make_manifest: Callable[[str, dict], dict]) -> str:
    """Turns a folder Reverb just wrote into a numbered, verified checkpoint.

    Args:
      reverb_path: the path `Client.checkpoint()` returned.
      make_manifest: called as `make_manifest(name, file_digests)` after the
        files are moved; returns the manifest to store beside them.

    Returns:
      The final checkpoint folder, `<root>/checkpoints/ckpt-N`.

    Raises:
      CheckpointCorruptError: if Reverb's folder is missing or incomplete.
    """
    if not os.path.isdir(reverb_path):
      raise errors.CheckpointCorruptError(
          f'Reverb reported checkpoint {reverb_path}, but it does not exist '
          f'(was something else written into {self.reverb_root}?).')
    missing = checkpoint_files.missing_files(reverb_path)
    if missing:
      raise errors.CheckpointCorruptError(
          f'Reverb checkpoint {reverb_path} is incomplete: missing {missing}.')
    os.makedirs(self.checkpoints_dir, exist_ok=True)
    existing = self.checkpoints()
    number = (checkpoint_number(existing[-1]) + 1) if existing else 1
    name = checkpoint_name(number)
    incoming = os.path.join(self.checkpoints_dir, _INCOMING + name)
    os.replace(reverb_path, incoming)
    try:
      manifest = make_manifest(name, checkpoint_files.file_digests(incoming))
      manifest_lib.write(os.path.join(incoming, manifest_lib.MANIFEST_NAME),
                         manifest)
    except BaseException:
      orphan = os.path.join(self.root, ORPHANED_DIR, name)
      os.makedirs(os.path.dirname(orphan), exist_ok=True)
      os.replace(incoming, orphan)
      logging.error('Writing the manifest of %s failed; its Reverb files are '
                    'kept in %s.', name, orphan)
      raise
    final = os.path.join(self.checkpoints_dir, name)
    os.replace(incoming, final)
    self.prune()
    return final

  def prune(self) -> None:
    """Keeps the newest `keep` checkpoints and removes interrupted commits."""
    for name in os.listdir(self.checkpoints_dir):
      if name.startswith(_INCOMING):
        shutil.rmtree(os.path.join(self.checkpoints_dir, name))
    for path in self.checkpoints()[:-self.keep]:
      shutil.rmtree(path)
