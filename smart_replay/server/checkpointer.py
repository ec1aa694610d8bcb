"""Saving a running Reverb server's tables as verified, numbered checkpoints.

`Checkpointer` does what a save of a smart_replay buffer adds to Reverb's own
`Client.checkpoint()`: it bounds the save by a timeout (Reverb's call has
none; a timed-out save goes on in its thread and the next save waits for
it), checks that Reverb really wrote every table's items, tidies what
earlier saves left, counts what was saved and commits the folder with its
manifest through a `CheckpointStore`. It also takes throwaway snapshots of
the tables (read, then deleted) for exact per-item statistics.

Typical use::

    checkpointer = Checkpointer(client, CheckpointStore(buffer_dir),
                                timeout_s=600)
    path = checkpointer.save(config.to_manifest(),
                             {'env_steps': 0, 'episodes': 0})
    checkpointer.close()
"""

import concurrent.futures
import json
import shutil
import time
from typing import Any, Dict, Mapping, Optional, Tuple

from absl import logging
import reverb

from smart_replay import errors
from smart_replay.server import local_server as server_lib
from smart_replay.server import stats as stats_lib
from smart_replay.storage import files as checkpoint_files
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import store as checkpoint_store
from smart_replay.storage import writer_marks
from smart_replay.utils import checks

TableStats = Dict[str, Dict[str, Any]]
# Where a manifest's counts keep every writer's marks (`storage.
# writer_marks`), if the buffer's steps carry writer ids.
WRITER_MARKS_KEY = 'writer_marks'


def check_extra(extra: Optional[Mapping[str, Any]]) -> None:
  """Raises unless every value of a manifest's `extra` is JSON-serializable.

  Args:
    extra: user metadata for a manifest, or None.

  Raises:
    ValueError: naming the first key whose value cannot be stored, its value
      and type, and how to convert it.
  """
  for key, value in (extra or {}).items():
    try:
      json.dumps(value)
    except (TypeError, ValueError) as e:
      raise ValueError(
          f'checkpoint(extra=...): extra[{key!r}] = {value!r} '
          f'({type(value).__name__}) is not JSON-serializable ({e}); convert '
          'it, e.g. int(train_step.numpy()).') from None


class Checkpointer:
  """Saves the tables of the Reverb server `client` talks to.

  The server's checkpointer must write into `store.reverb_root` (as
  `ReplayBufferManager` sets it up), or at least on the same file system,
  since a save is committed by moving Reverb's folder into the store.

  Args:
    client: a client of the server to save.
    store: the buffer directory's `CheckpointStore`.
    timeout_s: how long one Reverb save may take before `WaitTimeoutError`.
    info_timeout_s: how long the server may take to report its tables.

  Raises:
    ValueError: if a timeout is not a positive number.
  """

  def __init__(self, client: reverb.Client,
               store: checkpoint_store.CheckpointStore, *, timeout_s: float,
               info_timeout_s: float = 10.0):
    checks.positive('timeout_s', timeout_s)
    checks.positive('info_timeout_s', info_timeout_s)
    self._client = client
    self.store = store
    self._timeout_s = float(timeout_s)
    self._info_timeout_s = float(info_timeout_s)
    self._pool = concurrent.futures.ThreadPoolExecutor(
        1, thread_name_prefix='smart_replay_checkpoint')
    self._pending = None

  def table_stats(self) -> TableStats:
    """Reverb's counters of every table now (see `stats.table_stats`).

    Raises:
      WaitTimeoutError: if the server does not answer in time.
    """
    return stats_lib.table_stats(
        server_lib.server_info(self._client, self._info_timeout_s))

  def reverb_save(self) -> Tuple[str, TableStats, TableStats]:
    """Has Reverb write its tables, bounded by the timeout, and checks them.

    Returns:
      `(folder, stats_before, stats_after)`: the folder Reverb wrote, and
      `table_stats()` just before and after the save.

    Raises:
      WaitTimeoutError: if Reverb takes longer than `timeout_s` (the save
        continues; `wait_for_pending_save` waits for it).
      CheckpointWriteError: if Reverb failed to write, or wrote an
        incomplete folder (its leftovers are removed).
    """
    before = self.table_stats()
    save = self._pool.submit(self._client.checkpoint)
    try:
      path = server_lib.wait_for_checkpoint(save, timeout_s=self._timeout_s,
                                            where=self.store.reverb_root)
    except errors.WaitTimeoutError:
      self._pending = save
      raise
    except errors.CheckpointWriteError:
      self.tidy()  # Remove what the failed write left.
      raise
    after = self.table_stats()
    # The exact count is known only if nothing was inserted or sampled (a
    # sample can delete, an insert evict) while Reverb wrote: an equal size
    # alone may hide as many inserts as deletions.
    still = lambda name, t: all(after[name][k] == t[k]
                                for k in ('items', 'inserts', 'samples'))
    problems = checkpoint_files.written_problems(
        path, {name: t['items'] if still(name, t) else None
               for name, t in before.items()})
    if problems:
      shutil.rmtree(path, ignore_errors=True)
      free = shutil.disk_usage(self.store.root).free
      raise errors.CheckpointWriteError(
          f'Reverb reported checkpoint {path} as written, but it is '
          f"incomplete ({'; '.join(problems)}); it was removed. Reverb "
          f'ignores some write errors: its disk has {free:,} bytes free.')
    return path, before, after

  def wait_for_pending_save(self) -> None:
    """Waits (up to `timeout_s`) for a save that timed out earlier.

    Raises:
      WaitTimeoutError: if it is still being written after another
        `timeout_s`.
    """
    if self._pending is None:
      return
    try:
      self._pending.result(timeout=self._timeout_s)
    except concurrent.futures.TimeoutError as e:
      raise errors.WaitTimeoutError(
          'an earlier checkpoint is still being written to '
          f'{self.store.reverb_root} after another '
          f'{self._timeout_s:g} s.') from e
    except RuntimeError as e:
      logging.warning('An earlier timed-out checkpoint failed: %s', e)
    # Its folder (if any) was never committed; Reverb prunes it on the next
    # save, or the next start moves it to orphaned/.
    self._pending = None

  def tidy(self) -> None:
    """Recovers leftovers of interrupted saves (`CheckpointStore.recover`).

    A failure here is logged: Reverb's next save prunes its root anyway.
    """
    try:
      self.store.recover()
    except OSError as e:
      logging.warning('Could not tidy %s: %s', self.store.reverb_root, e)

  def save(self, config: Mapping[str, Any], counts: Mapping[str, Any], *,
           extra: Optional[Mapping[str, Any]] = None,
           layout: Any = None) -> str:
    """Writes a verified checkpoint: Reverb's save, counted and committed.

    Callers pause their own writers meanwhile if the manifest's counts are
    to describe exactly what was saved; items are recounted from the files
    when the tables changed during the save anyway.

    Args:
      config: the buffer config the manifest stores
        (`BufferConfig.to_manifest()` or `record.build_config(...)`).
      counts: `{'env_steps': n, 'episodes': n}`, optionally with
        `'tables': {table: {field: value}}` added to the measured table
        counters (e.g. `max_priority`).
      extra: JSON-serializable user metadata for the manifest.
      layout: the buffer's layout; if it stores writer ids, the manifest's
        counts get every writer's marks (`WRITER_MARKS_KEY`,
        `storage.writer_marks`).

    Returns:
      The checkpoint folder, `<store.root>/checkpoints/ckpt-N`.

    Raises:
      WaitTimeoutError: if Reverb's save, or an earlier timed-out one,
        takes longer than `timeout_s`.
      CheckpointWriteError: if the save failed (disk full, Reverb's write);
        nothing of it is left and earlier checkpoints are intact.
      CheckpointCorruptError: if Reverb's output is missing or incomplete.
    """
    self.wait_for_pending_save()
    self.tidy()
    save_started = time.time()
    reverb_path, before, tables = self.reverb_save()
    for name, fields in counts.get('tables', {}).items():
      tables[name].update(fields)
      before[name].update(fields)
    if tables != before:
      # Another client wrote or sampled meanwhile: count what was saved.
      stored = checkpoint_files.count_items(reverb_path)
      for name, table in tables.items():
        table['items'] = stored.get(name, 0)
    # save_started_unix: clients that confirmed items after it and then see
    # a server restored from this checkpoint count them as lost.
    counts = {**counts, 'tables': tables, 'save_started_unix': save_started}
    if getattr(layout, 'writer_ids', False):
      try:
        counts[WRITER_MARKS_KEY] = writer_marks.read(reverb_path, layout)
      except errors.CheckpointCorruptError:
        shutil.rmtree(reverb_path, ignore_errors=True)
        raise
    path = self.store.commit(
        reverb_path, lambda name, files: manifest_lib.build_manifest(
            config, counts=counts, files=files, checkpoint_name=name,
            extra=extra))
    logging.info('Checkpointed %s items, %d env steps to %s',
                 {n: t['items'] for n, t in tables.items()},
                 counts.get('env_steps', 0), path)
    return path

  def snapshot(self) -> str:
    """A throwaway Reverb save of the tables (the caller pauses its writers
    meanwhile, if the snapshot must be exact).

    Returns:
      The saved folder; the caller reads it and deletes it.

    Raises:
      WaitTimeoutError, CheckpointWriteError: as `reverb_save`.
    """
    self.wait_for_pending_save()
    path, _, _ = self.reverb_save()
    return path

  def close(self) -> None:
    """Lets go of the save thread; a save still running finishes in it."""
    self._pool.shutdown(wait=False)
