"""The layout of a buffer directory, and reading its checkpoints.

Reverb keeps only the newest folder *by name* in its checkpoint root and deletes
everything else there, names folders in local time, and restores silently from
any root it is pointed at. So a buffer directory is laid out as::

    <checkpoint_dir>/
      checkpoints/ckpt-000001/   committed checkpoints: Reverb files + manifest.json
      checkpoints/ckpt-000002/
      .reverb/                   Reverb's own root; empty between saves
      .lock                      held by the one manager writing this buffer
                                 (`smart_replay.storage.lock`)
      orphaned/                  interrupted saves and damaged checkpoints, set
                                 aside for inspection; keeps the newest 2
      .replaced/                 only during an overwrite: the old data, until the
                                 new buffer is up (then deleted) or it failed (restored)

This module names, finds and verifies checkpoints; writing them (the
crash-consistent commit, recovery and retention) is
`smart_replay.storage.store`.
"""

import os
import re
from typing import Iterator, List, Optional, Sequence, Tuple

from absl import logging

from smart_replay import errors
from smart_replay.storage import durable
from smart_replay.storage import files as checkpoint_files
from smart_replay.storage import foreign
from smart_replay.storage import manifest as manifest_lib

CHECKPOINTS_DIR = 'checkpoints'
REVERB_DIR = '.reverb'
ORPHANED_DIR = durable.ORPHANED_DIR
REPLACED_DIR = '.replaced'
# The observers' write-ahead journals (`storage.journal`).
JOURNAL_DIR = 'journal'
_NAME = re.compile(r'^ckpt-(\d{6,})$')


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
    ForeignCheckpointError: if it holds plain Reverb checkpoints instead
      (names the import call).
  """
  source = os.path.abspath(source)
  if not os.path.isdir(source):
    raise errors.CheckpointNotFoundError(
        f'no checkpoint to load: {source} does not exist. Expected a buffer '
        f'directory holding {CHECKPOINTS_DIR}/ckpt-NNNNNN folders, or one such '
        'folder.')
  if (os.path.isfile(os.path.join(source, manifest_lib.MANIFEST_NAME)) or
      checkpoint_files.is_reverb_checkpoint(source)):
    if foreign.folder_time(os.path.basename(source)) is not None:
      foreign.refuse_foreign(source)  # Plain Reverb's, named by its time.
    return [source]
  folder = os.path.join(source, CHECKPOINTS_DIR)
  found = []
  if os.path.isdir(folder):
    numbered = [(checkpoint_number(n), n) for n in os.listdir(folder)]
    found = [os.path.join(folder, n)
             for num, n in sorted((x for x in numbered if x[0] is not None),
                                  reverse=True)]
  if not found:
    foreign.refuse_foreign(source)
    raise errors.CheckpointNotFoundError(
        f'no checkpoint to load in {source}: expected {CHECKPOINTS_DIR}/'
        'ckpt-NNNNNN folders written by ReplayBufferManager.checkpoint() (or '
        'the path of one such folder). Use create_replay_buffer() to start an '
        'empty buffer.')
  return found


class Attempt:
  """One candidate checkpoint of `attempts`, to use as a context: a
  `CheckpointCorruptError` raised inside is recorded and the next candidate
  is tried; any other error propagates.

  Attributes:
    path: the candidate checkpoint folder.
  """

  def __init__(self, path: str, problems: List[str]):
    self.path = path
    self._problems = problems

  def __enter__(self) -> 'Attempt':
    return self

  def __exit__(self, kind, error, traceback) -> bool:
    if kind is None:
      if self._problems:
        logging.warning('Used %s because newer checkpoints are unusable: %s',
                        self.path, ' | '.join(self._problems))
      return False
    if issubclass(kind, errors.CheckpointCorruptError):
      self._problems.append(str(error))
      logging.warning('%s', error)
      return True  # The next candidate is tried.
    return False


def attempts(candidates: Sequence[str], *, failure: str) -> Iterator[Attempt]:
  """Tries checkpoints in order until one is usable::

      for attempt in attempts(find_checkpoints(source), failure='...'):
        with attempt:
          return load(attempt.path)  # CheckpointCorruptError: the next one

  Each candidate rejected (by a `CheckpointCorruptError` in its `with`
  block) is logged, and so is falling back past them.

  Args:
    candidates: checkpoint folders, preferred first (e.g. newest first, as
      `find_checkpoints` lists them).
    failure: the start of the message when none is usable, e.g.
      'no usable checkpoint in /buffers/run1'.

  Yields:
    An `Attempt` per candidate, until the caller leaves the loop.

  Raises:
    CheckpointCorruptError: once every candidate was rejected; `failure`,
      then every candidate's problem, separated by ' | '.
  """
  problems: List[str] = []
  for path in candidates:
    yield Attempt(path, problems)
  raise errors.CheckpointCorruptError(f'{failure}: ' + ' | '.join(problems))


def read_manifest(path: str) -> dict:
  """The manifest of checkpoint `path`, without verifying its files.

  Args:
    path: a checkpoint folder.

  Returns:
    The manifest dict.

  Raises:
    CheckpointCorruptError: if it is missing or unreadable; names the path.
  """
  try:
    return manifest_lib.read(os.path.join(path, manifest_lib.MANIFEST_NAME))
  except (OSError, ValueError) as e:
    raise errors.CheckpointCorruptError(f'{path}: {e}') from e


def newest_verified(source: str) -> Tuple[str, dict]:
  """`(path, manifest)` of the newest checkpoint at `source` that verifies.

  Args:
    source: a buffer directory or one checkpoint folder.

  Returns:
    The checkpoint folder and its manifest.

  Raises:
    CheckpointNotFoundError: if there is no checkpoint at `source`.
    CheckpointCorruptError: if none verifies; lists why.
  """
  for attempt in attempts(find_checkpoints(source),
                          failure=f'no checkpoint in {source} verifies'):
    with attempt:
      return attempt.path, verify(attempt.path)
