"""The interface between `ReplayBufferManager` and where its server lives."""

import abc
import dataclasses
from typing import Any, Callable, ContextManager, Dict, List, Mapping, Optional

from smart_replay import errors
from smart_replay.core import config as config_lib


@dataclasses.dataclass(frozen=True)
class Hooks:
  """What a backend may ask of the manager that holds it.

  Attributes:
    serve: `serve(client, **server)` makes the replay buffer, TF client and
      first observer of a started buffer; `server` is `local_server=` or
      `server_address=` for TF-Agents' `ReverbReplayBuffer`.
    flush: flushes every observer.
    lock: held while a step is written; pauses the writers.
    observers: returns the manager's observers.
    require_started: raises `ManagerStateError` unless the buffer is started.
  """
  serve: Callable[..., None]
  flush: Callable[[], None]
  lock: ContextManager[Any]
  observers: Callable[[], List[Any]]
  require_started: Callable[[], None]


class Backend(abc.ABC):
  """Starts, saves and describes a buffer in one mode (local or client).

  Attributes:
    config: the buffer's `BufferConfig`; None while not known (client mode
      before `connect`).
    where: the buffer, for messages (its directory, or the server).
    on_reconnect: what an observer calls after it reconnected, or None.
  """
  # {manager method: why this mode does not offer it}.
  UNSUPPORTED: Mapping[str, str] = {}
  config: Optional[config_lib.BufferConfig] = None
  where: str = ''
  on_reconnect: Optional[Callable[[Any], None]] = None

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

  def create(self, *, overwrite: bool) -> None:
    """Starts an empty buffer and serves it (see `Hooks.serve`).

    Args:
      overwrite: replace the data already there.
    """
    self.require('create_replay_buffer')
    raise NotImplementedError('create_replay_buffer')

  def load(self, source: Optional[str], *, overwrite: bool
           ) -> Dict[str, Any]:
    """Starts a buffer restored from a checkpoint and serves it.

    Args:
      source: where to load from (None: the buffer's own directory).
      overwrite: replace the data already there.

    Returns:
      `{'path', 'manifest'}` of the restored checkpoint.
    """
    self.require('load_replay_buffer')
    raise NotImplementedError('load_replay_buffer')

  def connect(self) -> None:
    """Connects to a running server and serves it."""
    self.require('connect')
    raise NotImplementedError('connect')

  def snapshot_items(self, table: str) -> List[Any]:
    """Every item of `table`, read from an exact snapshot.

    Args:
      table: the table's name.

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
                 starter: Optional[Dict[str, Any]] = None) -> str:
    """Flushes the observers and writes a verified checkpoint.

    Args:
      extra: user metadata for the manifest.
      counts: returns the manifest's counts once the observers are flushed.
      starter: the reference to a read-only starter table
        (`StarterSource.reference()`) the manifest stores beside the config.

    Returns:
      The checkpoint folder.
    """

  @abc.abstractmethod
  def times_sampled(self) -> Dict[str, Dict[int, int]]:
    """`{table: {item key: times sampled}}` from an exact snapshot."""

  def wait_for_pending_save(self) -> None:
    """Waits for a save that timed out earlier, if the mode has one."""

  @abc.abstractmethod
  def stop(self) -> None:
    """Stops serving (the server, or the connection); safe to repeat."""

  def release(self) -> None:
    """Lets go of what the buffer held until it closed."""
