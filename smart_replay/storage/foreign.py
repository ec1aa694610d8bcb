"""Reverb checkpoints written without smart_replay, and how to find them.

Plain Reverb writes a checkpoint as `<root>/<timestamp>/` (`tables.tfrecord`,
`items.tfrecord`, `chunks.tfrecord`, `DONE`): `replay_buffer.py_client
.checkpoint()` of TF-Agents' `ReverbReplayBuffer`, TF-Agents'
`ReverbCheckpointer`, and the buffer manager smart_replay replaces all do.
Such a folder has no `manifest.json`, so nothing says what it holds; it is
imported (`tools.takeover`), never loaded as it is.
"""

import datetime
import os
import re
from typing import List, Optional, Tuple

from smart_replay import errors
from smart_replay.storage import files as checkpoint_files
from smart_replay.storage import manifest as manifest_lib

# Reverb names a checkpoint folder by its save time, e.g.
# '2026-11-23T22:33:19.009192009+00:00' (nanoseconds, UTC offset).
_TIME_NAME = re.compile(r'^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?'
                        r'(Z|[+-]\d\d:\d\d)$')
IMPORT_HINT = (
    'Import it into a smart_replay buffer directory with '
    'smart_replay.tools.takeover.import_reverb_checkpoint(source, '
    'checkpoint_dir, data_spec=...) or `smart-replay-import '
    '--source=... --checkpoint_dir=... --spec_file=...`, then '
    'load_replay_buffer() that directory.')


def folder_time(name: str) -> Optional[int]:
  """The save time a Reverb checkpoint folder's name holds.

  Args:
    name: a folder name, e.g. '2026-11-23T22:33:19.009192009+00:00'.

  Returns:
    Nanoseconds since the epoch (UTC), or None if `name` is not such a time.
  """
  match = _TIME_NAME.match(name)
  if not match:
    return None
  seconds, fraction, zone = match.groups()
  zone = '+00:00' if zone == 'Z' else zone
  try:
    moment = datetime.datetime.fromisoformat(seconds + zone)
  except ValueError:
    return None
  return (int(moment.timestamp()) * 10**9 +
          int((fraction or '0').ljust(9, '0')))


def is_foreign(path: str) -> bool:
  """Whether `path` is a complete Reverb checkpoint without our manifest.

  Args:
    path: any path.

  Returns:
    True for a plain Reverb checkpoint folder.
  """
  return (checkpoint_files.is_reverb_checkpoint(path) and not os.path.exists(
      os.path.join(path, manifest_lib.MANIFEST_NAME)))


def foreign_checkpoints(source: str) -> List[Tuple[int, str]]:
  """The plain Reverb checkpoints at `source`, newest first.

  Args:
    source: a plain Reverb checkpoint folder, or a root holding such folders
      named by their save time.

  Returns:
    `(save time in ns, path)` pairs, newest first by the time in the folder
    name (not by name order); a folder given itself comes with its name's
    time, or 0.
  """
  source = os.path.abspath(source)
  if is_foreign(source):
    return [(folder_time(os.path.basename(source)) or 0, source)]
  if not os.path.isdir(source):
    return []
  found = []
  for name in os.listdir(source):
    path = os.path.join(source, name)
    moment = folder_time(name)
    if moment is not None and is_foreign(path):
      found.append((moment, path))
  return sorted(found, reverse=True)


def refuse_foreign(source: str) -> None:
  """Raises if `source` holds plain Reverb checkpoints (to be imported).

  Args:
    source: what a load was asked to read.

  Raises:
    ForeignCheckpointError: naming the newest plain checkpoint and the
      import call.
  """
  found = foreign_checkpoints(source)
  if found:
    raise errors.ForeignCheckpointError(
        f'{found[0][1]} is a plain Reverb checkpoint (written without '
        'smart_replay, e.g. by ReverbReplayBuffer.py_client.checkpoint() or '
        "TF-Agents' ReverbCheckpointer): it has no manifest saying what it "
        f'holds, so it is not loaded as it is. {IMPORT_HINT}')


def newest_foreign(source: str) -> str:
  """The newest complete plain Reverb checkpoint at `source`.

  Args:
    source: a plain Reverb checkpoint folder, or a root of such folders.

  Returns:
    Its path.

  Raises:
    ValueError: if `source` is a smart_replay checkpoint or buffer (load it
      instead).
    CheckpointNotFoundError: if there is none; names what was looked for.
  """
  source = os.path.abspath(source)
  if (os.path.exists(os.path.join(source, manifest_lib.MANIFEST_NAME)) or
      os.path.isdir(os.path.join(source, 'checkpoints'))):
    raise ValueError(f'{source} is a smart_replay buffer or checkpoint; load '
                     'it with ReplayBufferManager.load_replay_buffer(source=...)'
                     ' instead of importing it.')
  found = foreign_checkpoints(source)
  if not found:
    raise errors.CheckpointNotFoundError(
        f'no complete Reverb checkpoint at {source}: expected a folder holding '
        f'{", ".join(checkpoint_files.DATA_FILES)} and DONE, or a root of such '
        'folders named by their save time (e.g. '
        '2026-11-23T22:33:19.009192009+00:00).')
  return found[0][1]
