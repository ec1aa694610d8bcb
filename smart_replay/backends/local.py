"""An in-process Reverb server on a buffer directory the manager owns.

Reverb restores silently and lets a checkpoint's stored config win over the
requested one; this backend starts servers only on an empty Reverb root,
restores a checkpoint only explicitly (its fallback path) after verifying it
and comparing its manifest, and checks what the new server serves and holds.
"""

import contextlib
import dataclasses
import os
import shutil
from typing import Any, Callable, Dict, List, Optional, Sequence

from absl import logging
import portpicker

from smart_replay import errors
from smart_replay.backends import base
from smart_replay.config import buffer as config_lib
from smart_replay.config import options
from smart_replay.config import record
from smart_replay.config import reverb_tables
from smart_replay.server import checkpointer as checkpointer_lib
from smart_replay.server import local_server as server_lib
from smart_replay import layouts
from smart_replay.layouts import packed_steps
from smart_replay.storage import files as checkpoint_files
from smart_replay.storage import checkpoint_folders
from smart_replay.storage import lock as buffer_lock
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import reader as checkpoint_reader
from smart_replay.storage import store as checkpoint_store
from smart_replay.storage import writer_marks as writer_marks_lib


class LocalBackend(base.Backend):
  """Owns the buffer directory and an in-process server started from it.

  Args:
    config: the buffer's configuration.
    layout_given: whether `config.layout` was asked for; if not, a loaded
      checkpoint keeps its own layout.
    location: the buffer directory, checkpoints kept, port and whether
      other package versions load.
    timeouts: `connect_timeout_s` and `checkpoint_timeout_s` are used.

  Raises:
    ValueError: if the buffer directory is invalid.
  """
  UNSUPPORTED = {'connect': (
      'connect() is for client mode (ReplayBufferManager(..., '
      "server_address='host:port')); this manager owns its server: call "
      'create_replay_buffer() or load_replay_buffer().')}

  def __init__(self, config: config_lib.BufferConfig, *, layout_given: bool,
               location: options.LocalBuffer, timeouts: options.Timeouts):
    self.config = self._asked = config
    self._layout_given = layout_given
    self._store = checkpoint_store.CheckpointStore(
        str(location.checkpoint_dir), keep=location.keep_checkpoints)
    self.where = self._store.root
    # Held from create/load until close(): one writer per buffer directory.
    self._dir_lock = buffer_lock.BufferLock(self._store.root)
    self._port = location.port
    self._connect_timeout_s = timeouts.connect_timeout_s
    self._checkpoint_timeout_s = timeouts.checkpoint_timeout_s
    self._allow_version_mismatch = location.allow_version_mismatch
    self._server = self._client = self._checkpointer = None

  @property
  def checkpoint_dir(self) -> str:
    """The absolute buffer directory."""
    return self._store.root

  @property
  def keep_checkpoints(self) -> int:
    """How many complete checkpoints are kept on disk."""
    return self._store.keep

  # ----------------------------------------------------------------- start-up

  def create(self, *, overwrite: bool) -> base.Started:
    """Starts an empty buffer; see `ReplayBufferManager.create_replay_buffer`.

    Args:
      overwrite: replace the checkpoints already in the directory.

    Returns:
      What was started.

    Raises:
      CheckpointExistsError: if there are some and `overwrite` is False.
    """
    self._check_port()
    with self._locked_start():
      existing = self._store.existing_data()
      if existing and not overwrite:
        raise errors.CheckpointExistsError(
            f'{self._store.root} already holds a replay buffer checkpoint '
            f'({existing[-1]}); Reverb would silently restore it. Call '
            'load_replay_buffer() to continue that buffer, or pass '
            'overwrite=True to delete it and start empty.')
      self.config = self._asked
      return self._replacing(existing, self._start_empty)

  def load(self, source: Optional[str], *, overwrite: bool) -> base.Started:
    """Starts from the newest usable checkpoint at `source`; see
    `ReplayBufferManager.load_replay_buffer`.

    Args:
      source: None for the buffer's own directory; or another buffer
        directory, or one `ckpt-N` folder.
      overwrite: replace the directory's checkpoints when `source` is
        another buffer.

    Returns:
      What was started; `loaded` is `{'path', 'manifest'}` of the restored
      checkpoint.

    Raises:
      CheckpointExistsError: if loading another buffer into a non-empty
        directory without `overwrite`.
    """
    self._check_port()
    source = os.path.abspath(source) if source else self._store.root
    inside = os.path.commonpath([source, self._store.root]) == self._store.root
    with self._locked_start():
      candidates = checkpoint_folders.find_checkpoints(source)
      existing = [] if inside else self._store.existing_data()
      if existing and not overwrite:
        raise errors.CheckpointExistsError(
            f'{self._store.root} already holds checkpoints ({existing[-1]}); '
            f'loading {source} into it would mix two buffers. Call '
            'load_replay_buffer() without a source to continue this buffer, '
            'or pass overwrite=True to replace it.')
      return self._replacing(existing, lambda: self._start_first(
          candidates, failure=f'no usable checkpoint in {source}'))

  def _check_port(self) -> None:
    # Checked before anything moves, so a busy port is never mistaken for a
    # checkpoint Reverb could not restore.
    if self._port is not None and not portpicker.is_port_free(self._port):
      raise ValueError(f'port {self._port} is already in use; pass another '
                       'port or port=None to pick a free one.')

  @contextlib.contextmanager
  def _locked_start(self):
    """Takes the directory's lock and recovers interrupted saves; the lock is
    released again if the start fails."""
    self._dir_lock.acquire()
    try:
      self._store.recover()
      yield
    except BaseException:
      self._dir_lock.release()
      raise

  def _replacing(self, existing: Sequence[str], start: Callable[[], Any]
                 ) -> Any:
    """Runs `start()`; old data in the way is set aside until it succeeds."""
    moves = self._store.set_aside() if existing else []
    try:
      result = start()
    except BaseException:
      self.stop()
      self._store.restore_set_aside(moves)
      raise
    self._store.discard_set_aside(moves)
    return result

  def _start_empty(self) -> base.Started:
    started = self._start(fallback=None)
    sizes = {n: t['items'] for n, t in self._checkpointer.table_stats().items()}
    if any(sizes.values()):
      raise errors.CheckpointCorruptError(
          f'the new server in {self._store.root} is not empty ({sizes}); '
          'something restored data into it.')
    return started

  def _start_first(self, candidates: List[str], *,
                   failure: str) -> base.Started:
    """Starts from the first candidate that is usable (newest first)."""
    for attempt in checkpoint_folders.attempts(candidates, failure=failure):
      with attempt:
        return self._start_from(attempt.path)

  def _start_from(self, path: str) -> base.Started:
    """Verifies `path`, compares its manifest, starts and checks the server."""
    manifest = checkpoint_folders.verify(path)
    self.config = self._asked
    if not self._layout_given:  # Continue in the layout it was written in.
      self.config = dataclasses.replace(
          self._asked, layout=packed_steps.stored_name(manifest),
          frame_stack=layouts.stored_frame_stack(manifest))
    # Writer ids are not a user's choice: the checkpoint's stay.
    self.config = self.config.with_writer_ids_of(manifest)
    self.config.step_layout  # Raises on a layout this version lacks.
    diffs = self.config.diff(manifest)
    version_diffs = manifest_lib.diff_versions(manifest.get('versions', {}))
    if version_diffs and self._allow_version_mismatch:
      logging.warning('Loading %s written with other package versions:\n%s',
                      path, record.format_differences(
                          version_diffs, 'checkpoint', 'installed'))
    elif version_diffs:
      diffs += version_diffs
    if diffs:
      raise errors.ManifestMismatchError(
          f'checkpoint {path} was written with a different configuration '
          f'({len(diffs)} difference(s)):\n'
          + record.format_differences(diffs)
          + '\nPass the checkpoint\'s values to ReplayBufferManager (for '
          'versions: install them, or pass allow_version_mismatch=True), or '
          'create a new buffer.', diffs)
    try:
      started = self._start(fallback=path)
    except (RuntimeError, ValueError) as e:
      if isinstance(e, errors.SmartReplayError):
        raise
      raise errors.CheckpointCorruptError(
          f'Reverb could not restore {path}: {e}') from e
    try:
      self._check_restored(path, manifest)
    except BaseException:
      self.stop()
      raise
    return dataclasses.replace(started, loaded={'path': path,
                                                'manifest': manifest})

  def _check_restored(self, path: str, manifest: Dict[str, Any]) -> None:
    """Checks that the new server holds the items the manifest records.

    Remote clients (actors of a served buffer) may write the moment the
    restored server listens; the check then allows for what the tables'
    rate-limiter counters show happened since the restore.

    Raises:
      CheckpointCorruptError: if the restored items do not add up.
    """
    stats = self._checkpointer.table_stats()
    restored = {name: t['items'] for name, t in stats.items()}
    expected = {name: c['items']
                for name, c in manifest['counts']['tables'].items()}
    if restored == expected:
      return
    stored = checkpoint_files.read_table_counters(path)
    explained = True
    for name, want in expected.items():
      if restored.get(name) == want:
        continue
      counters = stored.get(name, {'inserts': 0, 'samples': 0})
      inserted = stats[name]['inserts'] - counters['inserts']
      sampled = stats[name]['samples'] - counters['samples']
      # An insert adds an item (evicting one when full); a sample may remove
      # one.
      explained = explained and bool(inserted or sampled) and (
          want - sampled <= restored[name] <= want + inserted)
    if not explained:
      raise errors.CheckpointCorruptError(
          f'checkpoint {path} restored {restored} items, but its manifest '
          f'records {expected}.')
    logging.info('Clients wrote to the restored server while it was checked '
                 '(%s items now, %s in %s).', restored, expected, path)

  def _start(self, fallback: Optional[str]) -> base.Started:
    """Starts a server on the empty Reverb root, restoring `fallback`."""
    config = self.config
    def make_tables():
      return [reverb_tables.make_table(
          c, config.step_layout.step_spec, config.step_layout.lookback)
              for c in config.tables]
    root = self._store.prepare_reverb_root()
    self._server, self._client = server_lib.start_local_server(
        make_tables, checkpoint_root=root, fallback_checkpoint=fallback,
        port=self._port, connect_timeout_s=self._connect_timeout_s)
    try:
      info = server_lib.server_info(self._client, self._connect_timeout_s)
      diffs = reverb_tables.server_differences(
          config.tables, config.step_layout.step_spec, info,
          config.step_layout.lookback)
      if diffs:
        raise errors.ManifestMismatchError(
            'the Reverb server does not serve the requested tables (a restored '
            'checkpoint overrode them):\n'
            + record.format_differences(diffs, 'running', 'requested'),
            diffs)
      if self._checkpointer is not None:
        self._checkpointer.close()
      self._checkpointer = checkpointer_lib.Checkpointer(
          self._client, self._store, timeout_s=self._checkpoint_timeout_s,
          info_timeout_s=self._connect_timeout_s)
      return base.Started(self._client, config,
                          {'local_server': self._server})
    except BaseException:
      self.stop()
      raise

  # ------------------------------------------------------------ checkpointing

  def existing_checkpoints(self) -> List[str]:
    """The directory's `ckpt-N` folders, oldest first."""
    return self._store.checkpoints()

  def checkpoint(self, *, extra: Optional[Dict[str, Any]],
                 counts: Dict[str, Any],
                 starter: Optional[Dict[str, Any]] = None,
                 writer_marks: bool = False) -> str:
    """Saves (with the buffer config and `counts`) through the
    `Checkpointer`.

    Args:
      extra: user metadata for the manifest.
      counts: the manager's counts of what its flushed observers wrote.
      starter: a starter reference the manifest stores under 'starter'.
      writer_marks: record every writer's marks in the manifest.

    Returns:
      The new `ckpt-N` folder.
    """
    config = self.config.to_manifest()
    if starter is not None:
      config = {**config, 'starter': starter}
    return self._checkpointer.save(
        config, counts, extra=extra,
        layout=self.config.step_layout if writer_marks else None)

  def snapshot(self) -> base.Snapshot:
    """A throwaway Reverb save of the tables, read from its files.

    Returns:
      A `FolderSnapshot` (its folder is deleted when it closes).
    """
    return FolderSnapshot(self._checkpointer.snapshot(),
                          self.config.step_layout)

  def wait_for_pending_save(self) -> None:
    """Waits (bounded) for a checkpoint that timed out earlier."""
    if self._checkpointer is not None:
      self._checkpointer.wait_for_pending_save()

  # ---------------------------------------------------------------- lifecycle

  def stop(self) -> None:
    """Stops the server (a save still running finishes in its thread)."""
    if self._server is not None:
      self._server.stop()
    self._server = self._client = None

  def release(self) -> None:
    """Lets go of the save thread and the directory's lock."""
    if self._checkpointer is not None:
      self._checkpointer.close()
    self._dir_lock.release()


class FolderSnapshot(base.Snapshot):
  """A throwaway Reverb save, read without a server.

  Args:
    path: the saved folder (deleted by `close`).
    layout: the buffer's layout, to decode its items.
  """

  def __init__(self, path: str, layout: Any):
    self._path, self._layout = path, layout

  def times_sampled(self) -> Dict[str, Dict[int, int]]:
    """`{table: {item key: times sampled}}`."""
    counts = {}
    for item in checkpoint_files.read_items(self._path):
      counts.setdefault(item.table, {})[item.key] = item.times_sampled
    return counts

  def items(self, table: str) -> List[Any]:
    """Every item of `table`, decoded (`CheckpointReader` items).

    Args:
      table: the table's name.
    """
    return list(checkpoint_reader.CheckpointReader(
        self._path, layout=self._layout).items(table))

  def writer_items(self) -> Dict[str, Dict[str, Dict[str, List[int]]]]:
    """Every writer's items in the snapshot
    (`storage.writer_marks.read_items`).

    Raises:
      ValueError: if the buffer's layout stores no writer ids.
    """
    return writer_marks_lib.read_items(self._path, self._layout)

  def close(self) -> None:
    """Deletes the folder."""
    shutil.rmtree(self._path, ignore_errors=True)
