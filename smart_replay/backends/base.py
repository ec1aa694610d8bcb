"""The interface between `ReplayBufferManager` and where its server lives."""

import abc
import dataclasses
from typing import (Any, Callable, ContextManager, Dict, List, Mapping,
                    Optional, Tuple)

import reverb

from smart_replay import errors
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


class Backend(abc.ABC):
  """Starts, saves and describes a buffer in one mode (local or client).

  Attributes:
    config: the buffer's `BufferConfig`; None while not known (client mode
      before `connect`).
    where: the buffer, for messages (its directory, or the server).
    restart_check_s: how often to call `restarted()` between writes; None
      when the server cannot restart under the manager (in-process).
  """
  # {manager method: why this mode does not offer it}.
  UNSUPPORTED: Mapping[str, str] = {}
  config: Optional[config_lib.BufferConfig] = None
  where: str = ''
  restart_check_s: Optional[float] = None

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

  def snapshot_items(self, table: str, *,
                     pause: Callable[[], ContextManager[Any]]) -> List[Any]:
    """Every item of `table`, read from an exact snapshot.

    Args:
      table: the table's name.
      pause: returns a context that flushes and pauses the writers.

    Returns:
      `CheckpointReader` items.
    """
    self.require('epoch')
    raise NotImplementedError('epoch')

  @abc.abstractmethod
  def existing_checkpoints(self) -> List[str]:
    """The buffer's `ckpt-N` folders, oldest first."""

  @abc.abstractmethod
  def checkpoint(self, *, extra: Optional[Dict[str, Any]],
                 counts: Callable[[], Dict[str, Any]],
                 flush: Callable[[], None],
                 starter: Optional[Dict[str, Any]] = None) -> str:
    """Flushes the observers and writes a verified checkpoint.

    Args:
      extra: user metadata for the manifest.
      flush: flushes the manager's observers.
      counts: returns the manifest's counts once the observers are flushed.
      starter: the reference to a read-only starter table
        (`StarterSource.reference()`) the manifest stores beside the config.

    Returns:
      The checkpoint folder.
    """

  @abc.abstractmethod
  def times_sampled(self, *, pause: Callable[[], ContextManager[Any]]
                    ) -> Dict[str, Dict[int, int]]:
    """`{table: {item key: times sampled}}` from an exact snapshot.

    Args:
      pause: returns a context that pauses the writers.
    """

  def restarted(self, *, patient: bool = True) -> Optional[Dict[str, Any]]:
    """Whether the server is a new instance since the last call (client
    mode).

    Args:
      patient: retry a server that does not answer (after a reconnect);
        False: one bounded attempt (a periodic check).

    Returns:
      The new instance's `{'restored_save_started': ...}`, or None if the
      server did not restart (always None for an in-process server).
    """
    return None

  def wait_for_pending_save(self) -> None:
    """Waits for a save that timed out earlier, if the mode has one."""

  @abc.abstractmethod
  def stop(self) -> None:
    """Stops serving (the server, or the connection); safe to repeat."""

  def release(self) -> None:
    """Lets go of what the buffer held until it closed."""
