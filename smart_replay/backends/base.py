"""The interface between `ReplayBufferManager` and where its server lives."""

import abc
import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

import reverb

from smart_replay import errors
from smart_replay.backends import instances as instances_lib
from smart_replay.config import buffer as config_lib


@dataclasses.dataclass(frozen=True)
class Started:
  """What a backend's start gives the manager.

  Attributes:
    client: a `reverb.Client` of the started server.
    config: the buffer's `BufferConfig` (a loaded checkpoint's layout, or
      the server's config in client mode).
    server: how TF-Agents' `ReverbReplayBuffer` reaches the server:
      `{'local_server': server}` or `{'server_address': 'host:port'}`.
    loaded: `{'path', 'manifest'}` of a restored checkpoint, or None.
    shards: a sharded buffer's clients, one per shard (`client` is the one
      this manager writes to); empty for one server.
  """
  client: reverb.Client
  config: config_lib.BufferConfig
  server: Mapping[str, Any]
  loaded: Optional[Dict[str, Any]] = None
  shards: Tuple[reverb.Client, ...] = ()


class Snapshot(abc.ABC):
  """An exact snapshot of a buffer's tables, read after it was taken."""

  @abc.abstractmethod
  def times_sampled(self) -> Dict[str, Dict[int, int]]:
    """`{table: {item key: times sampled}}`."""

  def items(self, table: str) -> List[Any]:
    """Every item of `table` (`CheckpointReader` items).

    Args:
      table: the table's name.

    Raises:
      ManagerStateError: where the snapshot holds counts only (client mode).
    """
    raise errors.ManagerStateError(
        f'the items of table {table!r} are read from a snapshot on the '
        "server's disk; read them where the buffer is served.")

  def writer_items(self) -> Dict[str, Dict[str, Dict[str, List[int]]]]:
    """Every writer's items in the snapshot
    (`storage.writer_marks.read_items`).

    Raises:
      ManagerStateError: where the snapshot holds counts only (client mode).
    """
    raise errors.ManagerStateError(
        'writer items are read from a snapshot on the server\'s disk; read '
        'them where the buffer is served.')

  def close(self) -> None:
    """Lets go of what the snapshot holds (its files)."""

  def __enter__(self) -> 'Snapshot':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


class CountsSnapshot(Snapshot):
  """A snapshot a server took and answered with its counts.

  Args:
    counts: `{table: {item key: times sampled}}`.
  """

  def __init__(self, counts: Dict[str, Dict[int, int]]):
    self._counts = counts

  def times_sampled(self) -> Dict[str, Dict[int, int]]:
    """`{table: {item key: times sampled}}`."""
    return self._counts


class Backend(abc.ABC):
  """Starts, saves and describes a buffer in one mode (local or client).

  Attributes:
    config: the buffer's `BufferConfig`; None while not known (client mode
      before `connect`).
    where: the buffer, for messages (its directory, or the server).
    watch_interval_s: how often the manager's watcher calls
      `check_servers()` and `restarted()`; None when no server can go down
      or restart under the manager (an in-process server).
    resends: whether observers keep what they sent, to send again what a
      restart of the server lost (`writer_marks`): one remote server.
  """
  # {manager method: why this mode does not offer it}.
  UNSUPPORTED: Mapping[str, str] = {}
  config: Optional[config_lib.BufferConfig] = None
  where: str = ''
  watch_interval_s: Optional[float] = None
  resends: bool = False

  def require(self, method: str) -> None:
    """Raises unless this mode offers the manager's `method`.

    Args:
      method: a `ReplayBufferManager` method name, e.g. 'connect'.

    Raises:
      ManagerStateError: saying why, and what to call instead.
    """
    if method in self.UNSUPPORTED:
      raise errors.ManagerStateError(self.UNSUPPORTED[method])

  @property
  @abc.abstractmethod
  def checkpoint_dir(self) -> Optional[str]:
    """The absolute buffer directory (None while unknown)."""

  @property
  @abc.abstractmethod
  def keep_checkpoints(self) -> Optional[int]:
    """How many complete checkpoints are kept (None while unknown)."""

  def create(self, *, overwrite: bool) -> Started:
    """Starts an empty buffer.

    Args:
      overwrite: replace the data already there.

    Returns:
      What was started.
    """
    self.require('create_replay_buffer')
    raise NotImplementedError('create_replay_buffer')

  def load(self, source: Optional[str], *, overwrite: bool) -> Started:
    """Starts a buffer restored from a checkpoint.

    Args:
      source: where to load from (None: the buffer's own directory).
      overwrite: replace the data already there.

    Returns:
      What was started, with `loaded` set.
    """
    self.require('load_replay_buffer')
    raise NotImplementedError('load_replay_buffer')

  def connect(self) -> Started:
    """Connects to a running server.

    Returns:
      What was started (the server's config).
    """
    self.require('connect')
    raise NotImplementedError('connect')

  @abc.abstractmethod
  def existing_checkpoints(self) -> List[str]:
    """The buffer's `ckpt-N` folders, oldest first."""

  @abc.abstractmethod
  def checkpoint(self, *, extra: Optional[Dict[str, Any]],
                 counts: Dict[str, Any],
                 starter: Optional[Dict[str, Any]] = None,
                 writer_marks: bool = False) -> str:
    """Writes a verified checkpoint (the manager flushed its observers and
    waited for an earlier save first: `wait_for_pending_save`).

    Args:
      extra: user metadata for the manifest.
      counts: the manifest's counts of what the observers wrote.
      starter: the reference to a read-only starter table
        (`StarterSource.reference()`) the manifest stores beside the config.
      writer_marks: an owned buffer's manifest records every writer's marks
        (`storage.writer_marks`; a served buffer's writers re-send from
        them); a server decides this for its clients.

    Returns:
      The checkpoint folder.
    """

  @abc.abstractmethod
  def snapshot(self) -> 'Snapshot':
    """Takes an exact snapshot of the tables now (the manager pauses its
    writers around this call; a server of client mode pauses its own).

    Returns:
      The snapshot, to read and close (a context manager).
    """

  def restarted(self, *, patient: bool = True,
                answered: Optional[Dict[str, Any]] = None
                ) -> Optional[Dict[str, Any]]:
    """Whether the server the observers write to is a new instance since
    the last call (client mode); each restart is reported once.

    Args:
      patient: retry a server that does not answer (after a reconnect);
        False: one bounded attempt (a periodic check).
      answered: the instance it just answered with (`check_servers`), so it
        is not asked again; None asks it.

    Returns:
      The new instance's `{'restored_save_started': ...}`, or None if the
      server did not restart (always None for an in-process server).
    """
    del patient, answered
    return None

  def writer_marks(self, writer_id: str, *, live: bool = False,
                   above: int = 0) -> Dict[str, Any]:
    """What the server has of one writer's items (`resends` only).

    Args:
      writer_id: the writer's id (`TrajectoryObserver.writer_id`).
      live: also list every item of the writer it holds now, from an exact
        snapshot of its tables (after a restart); False: the marks of its
        newest checkpoint only.
      above: with `live`, list the items from this call on.

    Returns:
      `{'checkpoint', 'number', 'marks', 'instance'}`: the newest checkpoint
      (live: the one the server restored), its number, the writer's marks
      there `{table: {stream: [seq, items]}}` (None without any) and the
      server instance's id; with `live` also `'held'`, `{table: {stream:
      [seq, ...]}}` (see `remote.handlers`).

    Raises:
      ManagerStateError: where observers keep nothing to send again.
    """
    del live, above
    raise errors.ManagerStateError(
        f'the buffer at {self.where} has no writers that send again '
        f'(writer {writer_id}).')

  def check_servers(self, timeout_s: float
                    ) -> List[instances_lib.Change]:
    """Asks every server which instance serves (once each, bounded).

    Args:
      timeout_s: how long each server may take to answer.

    Returns:
      What changed since the last call, server by server (none for an
      in-process server).
    """
    del timeout_s
    return []

  def server_states(self) -> List[Dict[str, Any]]:
    """Per server: `{'address', 'up', 'down_events'}` as the last
    `check_servers` saw them (empty for one server)."""
    return []

  @property
  def writer_server(self) -> int:
    """The index of the server the observers write to (its shard)."""
    return 0

  def wait_for_pending_save(self) -> None:
    """Waits for a save that timed out earlier, if the mode has one."""

  @abc.abstractmethod
  def stop(self) -> None:
    """Stops serving (the server, or the connection); safe to repeat."""

  def release(self) -> None:
    """Lets go of what the buffer held until it closed."""
