"""Reading a manager's buffer: item counts, statistics and epochs.

`Reporting` is the part of `ReplayBufferManager` behind `num_frames`,
`stats`, `num_batches` and `epoch`: it reads the running buffer's server
and observers, and snapshots through the backend.
"""

from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from smart_replay import errors
from smart_replay.backends import base as backend_lib
from smart_replay.manager import manager_options
from smart_replay.manager import state as state_lib
from smart_replay.sampling import epochs
from smart_replay.server import local_server as server_lib
from smart_replay.server import stats as stats_lib
from smart_replay.utils import checks
from smart_replay.layouts import packed_items


class Reporting:
  """Counts, statistics and epochs of a buffer.

  Args:
    state: the manager's state.
    options: the manager's options (the data spec, timeouts).
    backend: where the buffer lives (its snapshots).
  """

  def __init__(self, state: state_lib.State,
               options: manager_options.ManagerOptions,
               backend: backend_lib.Backend):
    self._state, self._options, self._backend = state, options, backend

  def _running(self) -> state_lib.Running:
    return self._state.require(started=True, where=self._backend.where)

  def num_frames(self) -> int:
    """Returns the number of items in the first table.

    It counts the items the server holds plus the ones this process's
    observers wrote that it does not hold yet (in a chunk still open, or in
    flight), at most the table's capacity: `stats()`'s `items`, defined in
    `smart_replay.writing.counters`. So it does not change when a `flush()` or
    `checkpoint()` sends them, and chunks are never cut short to count
    them. `stats()['tables'][name]['stored_items']` is the server's count
    alone (TF-Agents' `ReverbReplayBuffer.num_frames()`); in client mode,
    other processes' pending items are not counted.

    Returns:
      The items in the first table.

    Raises:
      ManagerStateError: if the manager is not started.
      WaitTimeoutError: if the server does not answer in time.
    """
    running = self._running()
    if running.shards:  # Every shard's items.
      return self.stats()['tables'][running.config.table().name]['items']
    return self._items(running, running.config.table().name)

  def _items(self, running: state_lib.Running, name: str) -> int:
    """A table's `items` (stored + this process's pending)."""
    stored = running.table_stats(self._options.timeouts.connect_timeout_s)[
        name]
    pending = stats_lib.pending_items(running.observers).get(name, 0)
    return stats_lib.items_now(stored['items'], pending, stored['max_size'])

  def stats(self, *, times_sampled: bool = False) -> Dict[str, Any]:
    """Returns what the buffer holds and has done, per table and in total.

    Args:
      times_sampled: also list how many times each item was sampled. This
        takes an exact snapshot of the tables (Reverb writes them to disk, as
        for a checkpoint, in `checkpoint_dir/.reverb/`, deleted afterwards;
        in client mode the server does it), so it costs about as much as
        `checkpoint()`.

    Returns:
      `{'tables': {name: {...}}, 'env_steps', 'episodes', 'short_episodes',
      'short_episode_steps', 'lost_steps', 'lost_items', 'lost_at_restart',
      'reconnects', 'resent_items'}`: every field is described in
      `smart_replay.server.stats.report`; an in-process buffer with a
      journal adds `'journal'` (`manager.journals.Journals.stats`).

    Raises:
      ManagerStateError: if the manager is not started.
      WaitTimeoutError: if the server does not answer in time.
    """
    running = self._running()
    counts = running.counts
    timeout_s = self._options.timeouts.connect_timeout_s
    # A sharded buffer: every shard's server_info, asked once each; the
    # writer shard's (with this process's observers) is the report's base.
    clients = [client for client, _ in running.shards] or [running.client]
    writer = clients.index(running.client)
    infos = [self._shard_info(client, timeout_s, writer=k == writer)
             for k, client in enumerate(clients)]
    result = stats_lib.report(
        running.config.tables, infos[writer], blocked=counts.blocked,
        observers=running.observers,
        priority_of=counts.priorities.new_item_priority,
        env_steps=counts.env_steps(running.observers),
        episodes=counts.episodes(running.observers))
    if running.shards:  # Every shard's tables, summed.
      result = stats_lib.add_shards(result, [
          (client.server_address, info and stats_lib.table_stats(
              info, running.config.table_names))
          for client, info in zip(clients, infos)], writer=writer,
          sampling=self._sampling())
    journal = running.journals and running.journals.stats(running.observers)
    if journal:
      result['journal'] = journal
    if times_sampled:
      sampled = {name: {} for name in result['tables']}
      with self._state.paused(flush=False):
        snapshot = self._backend.snapshot()
      with snapshot:
        sampled.update(snapshot.times_sampled())
      for name, per_item in sampled.items():
        result['tables'][name].update(stats_lib.times_sampled_fields(per_item))
    return result

  def _sampling(self) -> Optional[List[Dict[str, Any]]]:
    """Per shard: whether the watcher sees it up, and how often it saw it
    go down; None before the first check."""
    states = self._backend.server_states()
    return [{'up': s['up'], 'down_events': s['down_events']}
            for s in states] or None

  @staticmethod
  def _shard_info(client: Any, timeout_s: float, *,
                  writer: bool) -> Optional[Dict[str, Any]]:
    """A server's `server_info`; None for a shard other than the writer's
    that does not answer in 5 s (it shows as down)."""
    if writer:
      return server_lib.server_info(client, timeout_s)
    try:
      return server_lib.server_info(client, min(timeout_s, 5.0))
    except errors.WaitTimeoutError:
      return None

  def num_batches(self, batch_size: int, *, table_name: Optional[str] = None,
                  drop_remainder: bool = False) -> int:
    """Returns how many batches one `epoch()` of the table yields now.

    Args:
      batch_size: items per batch.
      table_name: the table; default the first.
      drop_remainder: count only full batches.

    Returns:
      `ceil(items / batch_size)` (`floor` with `drop_remainder`), with
      `items` as `num_frames()` counts them (`epoch()` flushes first).

    Raises:
      ValueError: if `batch_size` or the table is invalid, or the table holds
        packed items (its window count needs a snapshot: count `epoch()`).
      ManagerStateError: if the manager is not started.
    """
    checks.positive('batch_size', batch_size, integer=True)
    running = self._running()
    config = running.config.table(table_name)
    if config.block_length is not None:
      raise ValueError(
          f'table {config.name!r} holds packed items: blocks of up to '
          f'{config.windows_per_block} windows, so its items do not count its '
          'windows; len(list(epoch(batch_size))) counts the batches exactly.')
    return epochs.num_batches(self._items(running, config.name), batch_size,
                              drop_remainder=drop_remainder)

  def writer_items(self) -> Dict[str, Dict[str, Dict[str, List[int]]]]:
    """Every item each writer has in the tables now, by the call that wrote
    its last step (`storage.writer_marks.read_items`).

    Read from an exact snapshot (this manager's own observers pause
    meanwhile; Reverb writes the tables to disk, so it costs about as much
    as `checkpoint()`). A served buffer answers its remote writers with it
    after a restart (`resending.Resender.resend`).

    Returns:
      `{table: {writer_id: {stream: [seq, ...]}}}`, sorted, a seq once per
      item.

    Raises:
      ManagerStateError: if the manager is not started, or in client mode
        (the snapshot is on the server's machine).
      ValueError: if the buffer's layout stores no writer ids.
    """
    self._running()
    with self._state.paused(flush=False):
      snapshot = self._backend.snapshot()
    with snapshot:
      return snapshot.writer_items()

  def epoch(self, batch_size: int, *, table_name: Optional[str] = None,
            seed: Optional[int] = None, drop_remainder: bool = False
            ) -> Iterator[Tuple[Any, np.ndarray]]:
    """Visits every stored item of a table once, in shuffled order.

    For training in epochs rather than by sampling. When called, the
    observers are flushed and the table is read from an exact snapshot (as
    `stats(times_sampled=True)` takes, about the cost of a checkpoint;
    writing pauses only while Reverb writes it), so sampling counters and
    rate limiters are untouched and no item is seen twice or missed.

    Args:
      batch_size: items per batch.
      table_name: the table; default the first. Its items must all have one
        length (sequence tables; episode tables only if every episode has
        `episode_length` steps, else use `get_dataset`).
      seed: seed of the shuffle (None: a new order each call).
      drop_remainder: leave out the last, smaller batch.

    Returns:
      An iterator of `(trajectory, keys)`: a nest like the data spec with
      numpy arrays of shape `[batch, steps, ...]`, and the items' uint64
      keys `[batch]`.

    Raises:
      ValueError: if `batch_size` or the table is invalid, or the table holds
        items of different lengths.
      ManagerStateError: if the manager is not started, or in client mode
        (the snapshot is on the server's machine).
    """
    checks.positive('batch_size', batch_size, integer=True)
    running = self._running()
    self._backend.require('epoch')
    config = running.config.table(table_name)
    with self._state.paused(flush=True):  # Writers pause while Reverb saves.
      snapshot = self._backend.snapshot()
    with snapshot:
      items = snapshot.items(config.name)
    if config.block_length is not None:  # Every window of every block.
      items = packed_items.window_items(items, config.sequence_length)
    return epochs.batches(items,
                          self._options.data_spec, table=config.name,
                          batch_size=batch_size, seed=seed,
                          drop_remainder=drop_remainder)
