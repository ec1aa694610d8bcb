"""How a `ReplayServer` starts its buffer: open it, or reopen a checkpoint.

`open_buffer` creates the buffer or resumes its newest verified checkpoint
(as `on_existing` says); `reopen` restarts a served buffer from one of its
checkpoints, on the same port (a coordinated restore of a sharded buffer),
after `check_reloadable` has verified everything the restore needs, so a
restore that cannot succeed leaves the buffer serving with nothing dropped.
"""

import dataclasses
import os
from typing import Any, Dict, Optional, Tuple

from absl import logging

from smart_replay import errors
from smart_replay.config import record
from smart_replay.manager import facade as manager_lib
from smart_replay.remote import checkpoint_schedule as schedule_lib
from smart_replay.remote import serving_record
from smart_replay.storage import checkpoint_folders


def open_buffer(manager: manager_lib.ReplayBufferManager, *,
                on_existing: str) -> bool:
  """Creates the buffer, or resumes its newest verified checkpoint.

  Args:
    manager: an unstarted local manager.
    on_existing: 'resume', 'overwrite' or 'refuse' checkpoints already in
      its `checkpoint_dir`.

  Returns:
    True if a checkpoint was resumed, False if the buffer starts empty.

  Raises:
    CheckpointExistsError: if there are checkpoints and `on_existing` is
      'refuse'.
    ManifestMismatchError, CheckpointCorruptError: if resuming fails (see
      `ReplayBufferManager.load_replay_buffer`); nothing is deleted.
  """
  existing = manager.existing_checkpoints()
  if existing and on_existing == 'refuse':
    raise errors.CheckpointExistsError(
        f'{manager.checkpoint_dir} already holds checkpoints ({existing[-1]});'
        " pass on_existing='resume' to continue them or 'overwrite' to "
        'start empty.')
  if on_existing == 'resume':
    try:  # Also when only an interrupted first commit is there to adopt.
      manager.load_replay_buffer()
    except errors.CheckpointNotFoundError:
      pass
    else:
      logging.info('Resumed %s: %s items.', manager.loaded_checkpoint,
                   {n: t['items'] for n, t in
                    manager.loaded_manifest['counts']['tables'].items()})
      return True
  manager.create_replay_buffer(overwrite=bool(existing))
  return False


def check_reloadable(manager: manager_lib.ReplayBufferManager,
                     path: str) -> str:
  """Verifies, without touching the served buffer, that it can restart
  from `path`: one of its own checkpoints (resolved with `realpath`, inside
  its `checkpoints/` folder), complete and unchanged (`checkpoint_folders.verify`), of
  the served configuration.

  Args:
    manager: the started local manager serving the buffer.
    path: the checkpoint to restore.

  Returns:
    The checkpoint's resolved path.

  Raises:
    CheckpointNotFoundError: if `path` is not one of the buffer's own
      checkpoints.
    CheckpointCorruptError: if its files do not verify.
    ManifestMismatchError: if it holds another configuration.
  """
  own = {os.path.realpath(p): p for p in manager.existing_checkpoints()}
  resolved = os.path.realpath(path)
  if resolved not in own:
    names = [os.path.basename(p) for p in own.values()]
    raise errors.CheckpointNotFoundError(
        f'{path} is not one of the checkpoints of this buffer (its '
        f'checkpoints/ folder holds {names}); nothing was changed.')
  manifest = checkpoint_folders.verify(resolved)
  diffs = record.diff_config(manifest, manager.buffer_config)
  if diffs:
    raise errors.ManifestMismatchError(
        f'checkpoint {path} holds another configuration than the served '
        f'buffer ({len(diffs)} difference(s)); nothing was changed:\n'
        + record.format_differences(diffs, 'checkpoint', 'served'), diffs)
  return own[resolved]


def reopen(manager: manager_lib.ReplayBufferManager, path: str
           ) -> Tuple[manager_lib.ReplayBufferManager,
                      Optional[errors.SmartReplayError]]:
  """Closes `manager` and starts its buffer again from checkpoint `path`.

  Everything the restore needs is verified first (`check_reloadable`); if
  that fails, `manager` keeps serving and the error is raised.

  Args:
    manager: a started local manager.
    path: one of its `ckpt-N` folders.

  Returns:
    `(new manager, None)`: a manager with the same options, loaded from
    `path` (on the same port). If `path` still cannot be loaded (the disk
    failed meanwhile): `(a manager of the newest usable checkpoint, the
    error)`.

  Raises:
    CheckpointNotFoundError, CheckpointCorruptError, ManifestMismatchError:
      from `check_reloadable`; nothing was changed.
    SmartReplayError: if neither `path` nor any other checkpoint loads after
      the served buffer stopped; the caller must stop serving.
  """
  path = check_reloadable(manager, path)
  opts = manager.options
  # Every option given flat, so gin bindings of `ReplayBufferManager` (the
  # server's configs) cannot add to or clash with them.
  flat = {field.name: getattr(group, field.name)
          for group in (opts.shape, opts.location, opts.writes, opts.timeouts)
          for field in dataclasses.fields(group)}

  def fresh() -> manager_lib.ReplayBufferManager:
    return manager_lib.ReplayBufferManager(opts.data_spec, **flat)

  restored, fallback = fresh(), fresh()  # Built before anything stops.
  manager.close()
  try:
    restored.load_replay_buffer(path)
    return restored, None
  except errors.SmartReplayError as e:
    restored.close()
    try:
      fallback.load_replay_buffer()
    except errors.SmartReplayError as again:
      fallback.close()
      raise ReopenFailed(
          f'restoring {path} failed after its checks passed ({e}), and so '
          f'did reopening the newest usable checkpoint ({again}); the buffer '
          'is not served any more. Every checkpoint on disk is left as it '
          'was.') from again
    return fallback, e


class ReopenFailed(errors.SmartReplayError):
  """Neither the checkpoint to restore nor any other could be reopened once
  the served buffer had stopped: nothing is served any more."""


def restore(manager: manager_lib.ReplayBufferManager, path: str, *,
            reason: str) -> Tuple[manager_lib.ReplayBufferManager,
                                  Optional[errors.SmartReplayError],
                                  Dict[str, Any]]:
  """Restarts a served buffer from its checkpoint `path` (`reopen`), and
  counts and logs the items inserted after `path` was saved, which are
  dropped.

  Args:
    manager: the started local manager serving the buffer.
    path: one of its `ckpt-N` folders.
    reason: why, for the log.

  Returns:
    `(new manager, the error if the newest usable checkpoint was loaded
    instead, serving_record.reloaded(...) of what was dropped)`.
  """
  inserts = schedule_lib.total_counts(manager.stats())[0]
  manager, failure = reopen(manager, path)
  loaded = manager.loaded_checkpoint
  loss = serving_record.reloaded(
      inserts=inserts, checkpoint=loaded,
      restored_inserts=schedule_lib.saved_counts(loaded)[0])
  logging.warning('Restored %s (%s): %d item(s) inserted after it was saved '
                  'are dropped; connected writers count theirs.', loaded,
                  reason, loss['lost_items'])
  return manager, failure, loss
