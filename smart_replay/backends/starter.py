"""A starter buffer served read-only beside a run's own (online) buffer.

`StarterSource` restores the newest usable checkpoint of a starter buffer into
an in-process Reverb server of its own, with an empty, temporary Reverb root:
nothing writes to it (no observer or client of smart_replay gets a writer on
it), it is never checkpointed, and nothing is ever evicted from it, so its
items stay exactly what the starter's checkpoint holds. A run's checkpoints
store a *reference* to it (`reference()`: the starter's path, checkpoint and
fingerprint) instead of a copy of its items; loading such a checkpoint opens
the starter again and refuses one whose fingerprint differs.

The fingerprint is a digest of the checkpoint's recorded file digests, i.e. of
its content: a starter copied or moved elsewhere keeps it, so a run directory
stays loadable from the starter's new path (`ReplayBufferManager(...,
starter_dir=new_path)` or `smart-replay-train --starter_dir=new_path
--resume`).
"""

import hashlib
import json
import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Tuple

from absl import logging

from smart_replay import errors
from smart_replay.config import buffer as config_lib
from smart_replay.config import record
from smart_replay.config import reverb_tables
from smart_replay.server import local_server as server_lib
from smart_replay.storage import checkpoint_folders
from smart_replay.storage import manifest as manifest_lib

MANIFEST_KEY = 'starter'  # Where a run's manifest holds the reference.


def fingerprint(manifest: Dict[str, Any]) -> str:
  """The content fingerprint of a checkpoint: a digest of its file digests.

  Args:
    manifest: the checkpoint's manifest.

  Returns:
    16 hex digits, the same for any copy of the checkpoint.
  """
  files = json.dumps(manifest.get('files', {}), sort_keys=True)
  return hashlib.sha256(files.encode()).hexdigest()[:16]


class StarterSource:
  """A starter buffer's first table, restored read-only into its own server.

  Args:
    source: the starter's buffer directory, or one of its `ckpt-N` folders.
    expected_fingerprint: open only a checkpoint with this fingerprint (the
      one a run's checkpoint recorded); None opens the newest usable one.
    connect_timeout_s: how long the new server may take to answer.
    allow_version_mismatch: open a starter written with other dm-reverb,
      tensorflow or tf-agents versions (with a warning) instead of refusing.

  Raises:
    CheckpointNotFoundError: if there is no checkpoint at `source`.
    StarterMismatchError: if no checkpoint there has `expected_fingerprint`
      (the message lists both fingerprints).
    CheckpointCorruptError: if no checkpoint there is usable.
    ManifestMismatchError: if the starter was written with other package
      versions and `allow_version_mismatch` is False.
    WouldBlockError: if the starter's table cannot be sampled forever with
      nothing inserted (a samples_per_insert limiter, or fewer items than
      its min_size_to_sample).
  """

  def __init__(self, source: str, *, expected_fingerprint: Optional[str] = None,
               connect_timeout_s: float = 10.0,
               allow_version_mismatch: bool = False):
    self.source = os.path.abspath(source)
    self._connect_timeout_s = connect_timeout_s
    self._allow_version_mismatch = allow_version_mismatch
    self._server = self.client = None
    candidates = checkpoint_folders.find_checkpoints(self.source)
    if expected_fingerprint is not None:
      candidates = _with_fingerprint(candidates, expected_fingerprint,
                                     self.source)
    self._root = tempfile.mkdtemp(prefix='smart_replay_starter_')
    try:
      self.path, self.manifest = self._open_first(candidates)
    except BaseException:
      self.close()
      raise
    self.fingerprint = fingerprint(self.manifest)
    logging.info('Starter %s (fingerprint %s): %d items in table %r, served '
                 'read-only at %s.', self.path, self.fingerprint, self.items,
                 self.table.name, self.client.server_address)

  def _open_first(self, candidates: List[str]) -> Tuple[str, Any]:
    """`(path, manifest)` of the first candidate that opens."""
    for attempt in checkpoint_folders.attempts(
        candidates, failure=f'no usable starter checkpoint in {self.source}'):
      with attempt:
        return self._open(attempt.path)

  def _open(self, path: str):
    manifest = checkpoint_folders.verify(path)
    diffs = manifest_lib.diff_versions(manifest.get('versions', {}))
    if diffs and not self._allow_version_mismatch:
      raise errors.ManifestMismatchError(
          f'the starter {path} was written with other package versions:\n'
          + record.format_differences(diffs, 'starter', 'installed')
          + '\nInstall them, or pass allow_version_mismatch=True.', diffs)
    config = config_lib.BufferConfig.from_manifest(manifest)
    table = config.table()
    items = manifest['counts']['tables'][table.name]['items']
    _check_sampleable(path, table, items)
    self.config = config
    try:
      self._server, self.client = server_lib.start_local_server(
          lambda: [reverb_tables.make_table(
              c, config.step_layout.step_spec, config.step_layout.lookback)
                   for c in config.tables],
          checkpoint_root=self._root, fallback_checkpoint=path,
          connect_timeout_s=self._connect_timeout_s)
    except (RuntimeError, ValueError) as e:
      if isinstance(e, errors.SmartReplayError):
        raise
      raise errors.CheckpointCorruptError(
          f'Reverb could not restore the starter {path}: {e}') from e
    sizes = {name: info.current_size for name, info in server_lib.server_info(
        self.client, self._connect_timeout_s).items()}
    if sizes.get(table.name) != items:
      self._stop()
      raise errors.CheckpointCorruptError(
          f'the starter {path} restored {sizes} items, but its manifest '
          f'records {items} in table {table.name!r}.')
    return path, manifest

  @property
  def table(self):
    """The starter's first table's `TableConfig` (the one sampled)."""
    return self.config.table()

  @property
  def items(self) -> int:
    """Items of the starter's table (fixed: nothing writes to it)."""
    return int(self.manifest['counts']['tables'][self.table.name]['items'])

  def reference(self) -> Dict[str, Any]:
    """What a run's checkpoint records about this starter.

    Returns:
      `{'path', 'checkpoint', 'fingerprint', 'table', 'items'}`: the
      starter's buffer directory, the checkpoint folder served, its content
      fingerprint, the sampled table and its items.
    """
    return {'path': self.source, 'checkpoint': self.path,
            'fingerprint': self.fingerprint, 'table': self.table.name,
            'items': self.items}

  def _stop(self) -> None:
    if self._server is not None:
      self._server.stop()
    self._server = self.client = None

  def close(self) -> None:
    """Stops the server and removes its temporary root; safe to call twice."""
    self._stop()
    if self._root is not None:
      shutil.rmtree(self._root, ignore_errors=True)
      self._root = None

  def __enter__(self) -> 'StarterSource':
    """Returns the source itself; `close()` runs on leaving the block."""
    return self

  def __exit__(self, *exc_info) -> None:
    """Closes the source."""
    self.close()


def _check_sampleable(path: str, table: Any, items: int) -> None:
  """Raises WouldBlockError if `table` could not be sampled forever."""
  if table.samples_per_insert is not None or table.max_times_sampled:
    raise errors.WouldBlockError(
        f'the starter {path} has table {table.name!r} with '
        f'samples_per_insert={table.samples_per_insert}, max_times_sampled='
        f'{table.max_times_sampled}; nothing is inserted into a read-only '
        'starter, so sampling it would stop. Use a starter written with '
        'samples_per_insert=None and max_times_sampled=0.')
  if items < max(1, table.min_size_to_sample or 1):
    raise errors.WouldBlockError(
        f'the starter {path} holds {items} items in table {table.name!r}, '
        f'fewer than its min_size_to_sample={table.min_size_to_sample}; '
        'sampling it would wait forever.')


def _with_fingerprint(candidates: List[str], wanted: str, source: str
                      ) -> List[str]:
  """The candidates whose manifest has fingerprint `wanted`.

  Raises:
    StarterMismatchError: if none has; lists both fingerprints.
  """
  found, matching = [], []
  for path in candidates:
    try:
      got = fingerprint(checkpoint_folders.read_manifest(path))
    except errors.CheckpointCorruptError as e:
      found.append(f'{os.path.basename(path)}: unreadable ({e})')
      continue
    found.append(f'{os.path.basename(path)}: {got}')
    if got == wanted:
      matching.append(path)
  if not matching:
    raise errors.StarterMismatchError(
        f'the starter at {source} is not the one this run was trained with: '
        f'the run recorded fingerprint {wanted}, {source} holds '
        + ', '.join(found) + '. Pass the directory of the original starter '
        '(starter_dir=...; a moved or copied starter keeps its fingerprint).',
        [('starter.fingerprint', wanted, ', '.join(found))])
  return matching


def open_for(requested: Optional[str], recorded: Optional[Dict[str, Any]], *,
             loading: bool, where: str, **kwargs) -> Optional[StarterSource]:
  """Opens the starter a manager asked for and/or its checkpoint recorded.

  Args:
    requested: the manager's `starter_dir`, or None.
    recorded: the loaded checkpoint's starter reference, or None.
    loading: True when a checkpoint of the buffer was loaded (False for a
      new, empty buffer).
    where: the loaded checkpoint (for messages).
    **kwargs: `StarterSource` arguments (timeouts, version policy).

  Returns:
    The open `StarterSource`, or None if there is none to open.

  Raises:
    StarterMismatchError: if a starter was asked for but the loaded
      checkpoint was written without one, or its fingerprint differs.
    Whatever `StarterSource` raises.
  """
  if recorded is None:
    if requested is not None and loading:
      raise errors.StarterMismatchError(
          f'the checkpoint {where} was written without a starter table (it '
          f'records no starter), but starter_dir={requested!r} was given. '
          'Load it without starter_dir, or create a new buffer to train '
          'with a starter.', [('starter', None, requested)])
    return (StarterSource(requested, **kwargs) if requested is not None
            else None)
  return StarterSource(requested or recorded['path'],
                       expected_fingerprint=recorded['fingerprint'], **kwargs)
