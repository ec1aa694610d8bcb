"""Writing a buffer's checkpoints: a commit that survives a kill at any instant.

`CheckpointStore` owns the write side of the layout described in
`smart_replay.storage.checkpoint_folders`: it turns the folder Reverb wrote into a numbered,
fingerprinted, fsynced checkpoint (`commit`), recognises and cleans up what an
interrupted save left (`recover`, run at every start and before every save),
keeps the newest K checkpoints that verify (`prune`), and sets old data aside
during an overwrite. Failures of the file system (disk full, read-only, I/O
errors) become one `CheckpointWriteError` with nothing of the failed save left
behind.
"""

import os
import shutil
from typing import Callable, List, Tuple

from absl import logging

from smart_replay import errors
from smart_replay.storage import coordinated_records
from smart_replay.storage import durable
from smart_replay.storage import files as checkpoint_files
from smart_replay.storage import journal_segments
from smart_replay.storage import checkpoint_folders
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import ownership
from smart_replay.utils import checks

_INCOMING = '.incoming-'
# The steps of a commit, in order; see `CheckpointStore.commit`.
COMMIT_STEPS = ('reverb_written', 'moved', 'hashed', 'manifest_written',
                'renamed')


class CheckpointStore:
  """The checkpoint layout of one buffer directory (see module docstring).

  The directory is checked to be this user's own
  (`ownership.own_buffer_dir`) before anything in it is read; it is made
  (mode 0700) when the buffer starts (`BufferLock.acquire`).

  Args:
    root: the buffer's `checkpoint_dir`.
    keep: how many complete checkpoints to keep (>= 1).

  Raises:
    ValueError: if `keep` < 1 or `root` is empty.
    UnsafeBufferDirError: if another user could change the directory (names
      it, what is wrong and the fix).
  """

  def __init__(self, root: str, *, keep: int = 2):
    if not root:
      raise ValueError(f'checkpoint_dir must be a non-empty path, got {root!r}.')
    checks.positive('keep_checkpoints', keep, integer=True)
    # Checked now, made at the first write (`BufferLock.acquire`).
    self.root = ownership.own_buffer_dir(root, create=False)
    self.keep = keep
    # Checkpoint folder -> file fingerprint when it last verified.
    self._good = {}

  @property
  def reverb_root(self) -> str:
    """Reverb's own checkpoint root; empty between saves."""
    return os.path.join(self.root, checkpoint_folders.REVERB_DIR)

  @property
  def checkpoints_dir(self) -> str:
    """The folder holding the complete `ckpt-N` checkpoints."""
    return os.path.join(self.root, checkpoint_folders.CHECKPOINTS_DIR)

  def checkpoints(self) -> List[str]:
    """Returns the `ckpt-N` folders, oldest first (complete or not)."""
    if not os.path.isdir(self.checkpoints_dir):
      return []
    numbered = sorted((checkpoint_folders.checkpoint_number(n), n)
                      for n in os.listdir(self.checkpoints_dir)
                      if checkpoint_folders.checkpoint_number(n) is not None)
    return [os.path.join(self.checkpoints_dir, n) for _, n in numbered]

  def existing_data(self) -> List[str]:
    """Lists whatever in `root` a new buffer would shadow or Reverb would load.

    Returns:
      Paths of our checkpoints, of the observers' journal folder when a
      journal in it holds records, of anything in Reverb's root, and of Reverb
      checkpoint folders placed directly in `root` (a raw Reverb root).
    """
    found = list(self.checkpoints())
    journal = os.path.join(self.root, checkpoint_folders.JOURNAL_DIR)
    if ownership.real_folder(journal) and journal_segments.holds_records(journal):
      found.append(journal)  # Steps written since the last checkpoint.
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
    aside = os.path.join(self.root, checkpoint_folders.REPLACED_DIR)
    if os.path.lexists(aside):
      raise FileExistsError(
          f'{aside} holds data set aside by an interrupted overwrite; move or '
          'delete it before overwriting again.')
    moves = []
    for path in self.existing_data():
      target = os.path.join(aside, os.path.relpath(path, self.root))
      ownership.private_dir(aside)
      ownership.private_dir(os.path.dirname(target))
      os.replace(path, target)
      moves.append((path, target))
    return moves

  def restore_set_aside(self, moves: List[Tuple[str, str]]) -> None:
    """Puts back what `set_aside` moved (after a failed overwrite).

    Args:
      moves: what `set_aside` returned.
    """
    for original, moved_to in reversed(moves):
      ownership.private_dir(os.path.dirname(original))
      os.replace(moved_to, original)
    shutil.rmtree(os.path.join(self.root, checkpoint_folders.REPLACED_DIR),
                  ignore_errors=True)

  def discard_set_aside(self, moves: List[Tuple[str, str]]) -> None:
    """Deletes what `set_aside` moved (after a successful overwrite).

    Args:
      moves: what `set_aside` returned.
    """
    if moves:
      logging.warning('overwrite=True: deleted the previous buffer data: %s',
                      [original for original, _ in moves])
    shutil.rmtree(os.path.join(self.root, checkpoint_folders.REPLACED_DIR),
                  ignore_errors=True)

  def prepare_reverb_root(self) -> str:
    """Makes the buffer folder (0700, checked again) and Reverb's root exist,
    the latter empty, after `recover()`.

    Returns:
      The Reverb root path.
    """
    ownership.own_buffer_dir(self.root)
    self.recover()
    return ownership.private_dir(self.reverb_root)

  def recover(self) -> List[str]:
    """Cleans up after saves that a crash (or a failure) interrupted.

    Runs at every start and before every save, so checkpointing always
    continues after a kill at any instant:

    * a commit that got as far as a verified manifest (`.incoming-ckpt-N`) is
      adopted as the newest checkpoint `ckpt-N`, or set aside if a newer one
      exists; one without a verified manifest is incomplete and removed;
    * half-finished deletions (`.deleting-*`) are finished;
    * whatever is in Reverb's root is a save that was never committed: a
      complete Reverb folder is set aside to `orphaned/` (e.g. written by a
      plain `reverb.Client.checkpoint()` behind the manager's back), anything
      else is removed.

    Returns:
      One line per action taken (also logged).
    """
    actions = []
    durable.remove_interrupted_deletions(self.checkpoints_dir)
    if os.path.isdir(self.checkpoints_dir):
      for name in sorted(os.listdir(self.checkpoints_dir)):
        if name.startswith(_INCOMING):
          actions.append(self._recover_incoming(
              os.path.join(self.checkpoints_dir, name)))
    if os.path.isdir(self.reverb_root):
      for name in os.listdir(self.reverb_root):
        path = os.path.join(self.reverb_root, name)
        if checkpoint_files.is_reverb_checkpoint(path):
          durable.set_aside(
              self.root, path, reason='a complete Reverb checkpoint that was '
              'never committed (a save interrupted before its commit, or a '
              'plain reverb.Client.checkpoint() call: save with '
              'ReplayBufferManager.checkpoint())')
          actions.append(f'set aside {path}')
        else:
          durable.remove(path)
          logging.warning('Removed %s: an incomplete Reverb save.', path)
          actions.append(f'removed {path}')
    return actions

  def _recover_incoming(self, path: str) -> str:
    """Adopts, sets aside or removes one interrupted commit."""
    name = os.path.basename(path)[len(_INCOMING):]
    try:
      checkpoint_folders.verify(path)
    except errors.CheckpointCorruptError as e:
      durable.remove_tree(path)
      logging.warning('Removed %s: a commit interrupted before its manifest '
                      'was complete (%s).', path, e)
      return f'removed {path}'
    newest = self.checkpoints()
    number = checkpoint_folders.checkpoint_number(name)
    if number is not None and (
        not newest or number > checkpoint_folders.checkpoint_number(newest[-1])):
      final = os.path.join(self.checkpoints_dir, name)
      os.replace(path, final)
      durable.fsync_dir(self.checkpoints_dir)
      self._good[final] = _fingerprint(final)
      logging.warning('Adopted %s as checkpoint %s: its commit was interrupted '
                      'after the manifest was written and verifies.', path,
                      final)
      return f'adopted {final}'
    durable.set_aside(self.root, path, reason='an interrupted commit older '
                      'than the newest checkpoint')
    return f'set aside {path}'

  def commit(self, reverb_path: str,
             make_manifest: Callable[[str, dict], dict]) -> str:
    """Turns a folder Reverb just wrote into a numbered, verified checkpoint.

    The steps, each recoverable by `recover()` if the process dies there:
    fsync Reverb's files; move them to `checkpoints/.incoming-ckpt-N`;
    fingerprint them; write the manifest (atomically, fsynced); rename to
    `ckpt-N` and fsync `checkpoints/`, which is the commit; prune. A failure
    removes what the save left and leaves every earlier checkpoint intact.

    Args:
      reverb_path: the path `Client.checkpoint()` returned.
      make_manifest: called as `make_manifest(name, file_digests)` after the
        files are moved; returns the manifest to store beside them.

    Returns:
      The final checkpoint folder, `<root>/checkpoints/ckpt-N`.

    Raises:
      CheckpointCorruptError: if Reverb's folder is missing or incomplete.
      CheckpointWriteError: if a file operation fails (disk full, read-only,
        I/O error); names the path and the cause.
    """
    if not os.path.isdir(reverb_path):
      raise errors.CheckpointCorruptError(
          f'Reverb reported checkpoint {reverb_path}, but it does not exist '
          f'(was something else written into {self.reverb_root}?).')
    missing = checkpoint_files.missing_files(reverb_path)
    if missing:
      durable.remove(reverb_path)
      raise errors.CheckpointCorruptError(
          f'Reverb checkpoint {reverb_path} is incomplete: missing {missing}.')
    _fault_point('reverb_written')
    ownership.own_buffer_dir(self.root)  # Made if a save comes first.
    incoming = final = None
    try:
      durable.fsync_tree(reverb_path)
      ownership.private_dir(self.checkpoints_dir)
      existing = self.checkpoints()
      number = (checkpoint_folders.checkpoint_number(existing[-1]) + 1
                if existing else 1)
      name = checkpoint_folders.checkpoint_name(number)
      incoming = os.path.join(self.checkpoints_dir, _INCOMING + name)
      os.replace(reverb_path, incoming)
      durable.fsync_dir(self.checkpoints_dir)
      _fault_point('moved')
      files = checkpoint_files.file_digests(incoming)
      _fault_point('hashed')
      manifest_lib.write(os.path.join(incoming, manifest_lib.MANIFEST_NAME),
                         make_manifest(name, files))
      durable.fsync_dir(incoming)
      _fault_point('manifest_written')
      final = os.path.join(self.checkpoints_dir, name)
      os.replace(incoming, final)
      durable.fsync_dir(self.checkpoints_dir)
    except BaseException as e:
      for leftover in (reverb_path, incoming, final):
        try:
          durable.remove(leftover)
        except OSError as cleanup_error:  # recover() retries at the next save.
          logging.error('Could not remove %s after a failed save: %s',
                        leftover, cleanup_error)
      if not isinstance(e, OSError):
        raise
      raise errors.CheckpointWriteError(
          f'saving checkpoint {final or incoming or reverb_path} failed: '
          f'{e.strerror or e} ({type(e).__name__}, errno {e.errno}). The '
          'incomplete save was removed; earlier checkpoints are intact and the '
          'buffer keeps serving. Free space (or fix the disk) and checkpoint '
          'again.') from e
    self._good[final] = _fingerprint(final)
    _fault_point('renamed')
    try:
      self.prune()
    except OSError as e:  # Committed; pruning is retried at the next save.
      logging.error('Checkpoint %s is committed, but pruning old ones failed '
                    '(retried at the next save): %s', final, e)
    return final

  def is_good(self, path: str) -> bool:
    """Tells whether the checkpoint at `path` verifies (cached per file state).

    Args:
      path: a `ckpt-N` folder.

    Returns:
      True if its manifest and files verify; a result is reused while the
      files' sizes, inodes and modification times stay the same.
    """
    fingerprint = _fingerprint(path)
    if fingerprint is not None and self._good.get(path) == fingerprint:
      return True
    try:
      checkpoint_folders.verify(path)
    except errors.CheckpointCorruptError:
      return False
    self._good[path] = fingerprint
    return True

  def prune(self) -> None:
    """Keeps the newest `keep` checkpoints that verify in each retention
    group (`coordinated_records.retention_group`): the buffer's own, coordinated
    ones, and those clients asked for over the network, so that a flood of
    client requests never prunes a checkpoint the server made. Coordinated
    checkpoints no record names keep only the newest (a save in progress),
    so uncommitted saves never prune a committed one; the manager's
    automatic ones (journal bound) keep only the newest, beside the others.

    A checkpoint that does not verify is never counted as kept: it is set
    aside to `orphaned/` (bounded, see `durable.set_aside`), so retention
    never deletes a good checkpoint while keeping a damaged one. Deletions
    are crash-safe (`durable.remove_tree`).

    Raises:
      OSError: if moving or deleting fails.
    """
    kept = {}  # Checkpoints kept per retention group.
    committed = coordinated_records.recorded_ids(self.root)
    for path in reversed(self.checkpoints()):
      if not self.is_good(path):
        durable.set_aside(self.root, path, reason='it does not verify')
        self._good.pop(path, None)
        continue
      group = coordinated_records.retention_group(
          checkpoint_folders.read_manifest(path), committed)
      limit = {coordinated_records.UNCOMMITTED_GROUP:
                   coordinated_records.KEEP_UNCOMMITTED,
               coordinated_records.AUTOMATIC_GROUP:
                   coordinated_records.KEEP_AUTOMATIC}.get(group, self.keep)
      if kept.get(group, 0) < limit:
        kept[group] = kept.get(group, 0) + 1
      else:
        durable.remove_tree(path)
        self._good.pop(path, None)
    durable.fsync_dir(self.checkpoints_dir)


def _fingerprint(path: str):
  """(name, size, inode, mtime) of every file of a checkpoint, or None."""
  try:
    return tuple(sorted((e.name, e.stat().st_size, e.stat().st_ino,
                         e.stat().st_mtime_ns) for e in os.scandir(path)))
  except OSError:
    return None


def _fault_point(step: str) -> None:
  """A named step of `CheckpointStore.commit` (`COMMIT_STEPS`).

  Does nothing; durability tests replace it to kill the process (or raise)
  at exactly this step.
  """
  del step
