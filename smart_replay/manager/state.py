"""The state one `ReplayBufferManager` keeps over its lifetime.

`State` is small on purpose: the guard (open, same process, started or not),
the lock writers and saves share, the `Running` buffer (what a start built:
client, config, replay buffer, observers, starter) and the `Counts` a
checkpoint records beside Reverb's. Everything else (options, the backend)
is frozen or owned by the part that uses it.
"""

import atexit
import contextlib
import dataclasses
import os
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from absl import logging
import reverb
import tensorflow as tf

from smart_replay import errors
from smart_replay.backends import starter as starter_lib
from smart_replay.config import buffer as config_lib
from smart_replay.server import priorities as priorities_lib
from smart_replay.server import local_server as server_lib
from smart_replay.server import stats as stats_lib
from smart_replay.writing import observer as observer_lib


class Counts:
  """What a checkpoint's manifest counts beside Reverb's table counters.

  Args:
    config: the started buffer's config (its tables' priorities).
    manifest: the loaded checkpoint's manifest, whose counts carry on; None
      for a new buffer.
  """

  def __init__(self, config: config_lib.BufferConfig,
               manifest: Optional[Dict[str, Any]] = None):
    self.priorities = priorities_lib.Priorities(config.tables)
    self.blocked = stats_lib.BlockedSince()
    self._steps = self._episodes = 0
    if manifest is not None:
      counts = manifest['counts']
      self._steps, self._episodes = counts['env_steps'], counts['episodes']
      self.priorities.restore(counts['tables'])

  def env_steps(self, observers: List[observer_lib.TrajectoryObserver]
                ) -> int:
    """Env steps written through the buffer, with those of a loaded one
    (boundary steps are not counted; see `counters.Counters.env_steps`)."""
    return self._steps + sum(o.live_counters.env_steps for o in observers)

  def episodes(self, observers: List[observer_lib.TrajectoryObserver]) -> int:
    """Finished episodes likewise."""
    return self._episodes + sum(o.num_episodes for o in observers)

  def add_replayed(self, env_steps: int, episodes: int) -> None:
    """Counts what a journal replayed (its observer is not kept)."""
    self._steps += env_steps
    self._episodes += episodes

  def manifest_counts(self, observers: List[observer_lib.TrajectoryObserver]
                      ) -> Dict[str, Any]:
    """The counts a checkpoint's manifest records."""
    return {'env_steps': self.env_steps(observers),
            'episodes': self.episodes(observers),
            'tables': {name: {'max_priority': p}
                       for name, p in self.priorities.current().items()}}

  def reset(self) -> None:
    """Back to zero (the tables were emptied)."""
    self._steps = self._episodes = 0
    self.priorities.reset()
    self.blocked.clear()


class Batchers:
  """The batchers of a buffer's datasets: told what the watcher sees, and
  closed (their iterators raise) when the buffer stops, after which no
  dataset can be made. Each is kept (with its queues and variables) until
  then, so that no iterator outlives what its graph uses."""

  def __init__(self):
    self._live: List[Any] = []
    self._lock = threading.Lock()
    self._closed = False
    # Closed before Python finalizes too, so that no iterator destroyed
    # then has a feed waiting in a queue.
    atexit.register(_close_at_exit, weakref.ref(self))

  def add(self, batcher: Any, where: str) -> None:
    """Registers a new dataset's batcher.

    Args:
      batcher: a `sampling.batcher.Batcher`.
      where: the buffer, for the message of a stopped one.

    Raises:
      ManagerStateError: if the buffer stopped.
    """
    with self._lock:
      if self._closed:
        batcher.close()
        raise errors.ManagerStateError(
            f'the buffer ({where}) was closed (its manager closed); make a '
            'new dataset from a new manager.')
      self._live.append(batcher)

  def __iter__(self) -> Iterator[Any]:
    with self._lock:
      return iter(list(self._live))

  def close(self) -> None:
    """Closes every registered batcher; refuses new ones."""
    with self._lock:
      self._closed = True
      live = list(self._live)
    for batcher in live:
      batcher.close()


def _close_at_exit(batchers: Callable[[], Optional[Batchers]]) -> None:
  """Closes the batchers still registered when the interpreter exits."""
  live = batchers()
  if live is not None:
    live.close()


@dataclasses.dataclass
class Running:
  """What a start built; dropped when the buffer stops.

  Attributes:
    client: the `reverb.Client` of the server.
    config: the buffer's config.
    replay_buffer: the TF-Agents replay buffer on the first table.
    tf_client: the `reverb.TFClient` priorities are updated through.
    counts: the counts a checkpoint records.
    observers: the manager's observers, the first returned by the start.
    starter: the read-only starter table served beside the buffer, or None.
    shards: a sharded buffer's clients and TF clients, one pair per shard
      (`client` is the one written to); empty for one server.
    shards_up: bool `[shards]`, whether each shard answers (set by the
      watcher; priority updates skip a shard that is down).
    batchers: the batchers of its datasets.
    journals: the in-process buffer's write-ahead journals
      (`journals.Journals`), or None.
  """
  client: reverb.Client
  config: config_lib.BufferConfig
  replay_buffer: Any
  tf_client: reverb.TFClient
  counts: Counts
  observers: List[observer_lib.TrajectoryObserver] = dataclasses.field(
      default_factory=list)
  starter: Optional[starter_lib.StarterSource] = None
  shards: Tuple[Tuple[reverb.Client, reverb.TFClient], ...] = ()
  shards_up: Optional[tf.Variable] = None
  batchers: Batchers = dataclasses.field(default_factory=Batchers)
  journals: Any = None

  def flush(self) -> None:
    """Flushes every observer.

    Raises:
      WaitTimeoutError: if the server does not accept pending items in time.
      ServerUnavailableError, WriteFailedError: if an observer lost steps.
    """
    for obs in self.observers:
      obs.flush()

  def server_info(self, timeout_s: float) -> Dict[str, Any]:
    """`server_info()` of the server, within `timeout_s`.

    Raises:
      WaitTimeoutError: if the server does not answer in time.
    """
    return server_lib.server_info(self.client, timeout_s)

  def table_stats(self, timeout_s: float) -> Dict[str, Dict[str, int]]:
    """Reverb's counters of the buffer's tables (`stats.table_stats`).

    Raises:
      WaitTimeoutError: if the server does not answer in time.
    """
    return stats_lib.table_stats(self.server_info(timeout_s),
                                 self.config.table_names)


class State:
  """A manager's lifetime; see the module docstring.

  Attributes:
    lock: held while a step is written, and by checkpoint/clear/close, so a
      checkpoint sees whole steps and its counts match its data.
    running: the started buffer, or None.
    loaded: `{'path', 'manifest'}` of the checkpoint a load restored, or
      None.
    serving: a variable a traced priority update reads; False once stopped,
      so it fails instead of waiting on a stopped server.
    closed: whether `close()` ran.
  """

  def __init__(self):
    self.lock = threading.RLock()
    self.running: Optional[Running] = None
    self.loaded: Optional[Dict[str, Any]] = None
    self.serving = tf.Variable(False, trainable=False, name='serving')
    self.closed = False
    self._pid = os.getpid()

  def require(self, *, started: Optional[bool], where: str = '') -> Running:
    """Raises unless open and (if `started` is not None) started or not.

    Args:
      started: True: must be started; False: must not be; None: either.
      where: the buffer, for the message of a closed manager.

    Returns:
      The running buffer (None if not started).

    Raises:
      ManagerStateError: saying which, and what to call.
    """
    if os.getpid() != self._pid:
      raise errors.ManagerStateError(
          f'this ReplayBufferManager was created in process {self._pid} and '
          f'is used in process {os.getpid()}, a forked copy: a Reverb client '
          'hangs after fork. Start worker processes with '
          "multiprocessing.get_context('spawn') and build a manager in each "
          "(client mode: server_address=...).")
    if self.closed:
      raise errors.ManagerStateError(
          f'this ReplayBufferManager ({where}) is closed; create a new one.')
    if started and self.running is None:
      raise errors.ManagerStateError(
          'the buffer is not started; call create_replay_buffer() or '
          'load_replay_buffer() first (connect() in client mode).')
    if started is False and self.running is not None:
      raise errors.ManagerStateError(
          'the buffer is already started (server at '
          f'{self.running.client.server_address}).')
    return self.running

  @contextlib.contextmanager
  def paused(self, *, flush: bool) -> Iterator[None]:
    """Holds the writers' lock (after flushing the observers, if asked)."""
    with self.lock:
      if flush and self.running is not None:
        self.running.flush()
      yield

  def resumed(self, loaded: Dict[str, Any]) -> None:
    """Logs and records the checkpoint a load restored.

    Args:
      loaded: `{'path', 'manifest'}`.
    """
    self.loaded = loaded
    counts = loaded['manifest']['counts']
    logging.info('Loaded replay buffer from %s: %s items, %d env steps.',
                 loaded['path'],
                 {n: c['items'] for n, c in counts['tables'].items()},
                 counts['env_steps'])
