"""The state a `ReplayBufferManager` shares with its parts.

One `Session` per manager holds what the manager's parts (`Sampling`,
`Reporting`, the facade itself) read and change: the backend and its
config, and while the buffer is started the Reverb client, the TF client
for priorities, the replay buffer, the observers and the priority state. It
checks the manager's state (open, started, same process) for all of them.
"""

import os
import threading
from typing import Any, Callable, Dict, List, Optional

from absl import logging
import reverb
import tensorflow as tf

from smart_replay import errors
from smart_replay.backends import base as backend_lib
from smart_replay.core import config as config_lib
from smart_replay.core import local_server as server_lib
from smart_replay.core import observer as observer_lib
from smart_replay.core import priorities as priorities_lib
from smart_replay.core import replay_buffer as replay_buffer_lib
from smart_replay.core import stats as stats_lib
from smart_replay.mixing import starter as starter_lib


class Session:
  """A manager's shared state; see the module docstring.

  Args:
    data_spec: the spec of one step.
    num_envs: environments the first observer receives steps of (or None).
    sample_timeout_s: how long sampling waits for data.
    connect_timeout_s: how long the server may take to answer.
    observer_args: further `TrajectoryObserver` arguments (chunk length,
      value policies, write and reconnect timeouts).
    checkpoint: the manager's `checkpoint` (the replay buffer's
      `py_client.checkpoint()`).
    make_dataset: the manager's `get_dataset` (the replay buffer's
      `as_dataset`).
    starter_dir: a starter buffer to serve read-only beside the buffer.
    allow_version_mismatch: open a starter of other package versions.
  """

  def __init__(self, data_spec: Any, *, num_envs: Optional[int],
               sample_timeout_s: float, connect_timeout_s: float,
               observer_args: Dict[str, Any], checkpoint: Callable[[], str],
               make_dataset: Callable[..., tf.data.Dataset],
               starter_dir: Optional[str] = None,
               allow_version_mismatch: bool = False):
    self._checkpoint, self._make_dataset = checkpoint, make_dataset
    self.starter_dir = starter_dir
    self._allow_version_mismatch = allow_version_mismatch
    # The read-only starter table served beside the buffer (see
    # `mixing.starter`), from start until unserve().
    self.starter: Optional[starter_lib.StarterSource] = None
    self.data_spec = data_spec
    self.num_envs = num_envs
    self.sample_timeout_s = sample_timeout_s
    self.connect_timeout_s = connect_timeout_s
    self._observer_args = observer_args
    self.backend: Optional[backend_lib.Backend] = None
    # Held while a step is written, and by checkpoint/clear/close, so that a
    # checkpoint sees whole steps and its counts match its data.
    self.lock = threading.RLock()
    self.pid = os.getpid()
    self.closed = False
    self.client = self.tf_client = self.replay_buffer = None
    self.priorities = self._priorities_of = None
    self.observers: List[observer_lib.TrajectoryObserver] = []
    self.steps_offset = self.episodes_offset = 0
    self.loaded_manifest = self.loaded_checkpoint = None
    self.blocked = stats_lib.BlockedSince()
    # False once closed: a traced update_priorities then fails instead of
    # waiting forever on the stopped server.
    self.serving = tf.Variable(False, trainable=False, name='serving')

  @property
  def config(self) -> Optional[config_lib.BufferConfig]:
    """The buffer's config (None in client mode before `connect()`)."""
    return self.backend.config

  def require(self, *, started: Optional[bool]) -> None:
    """Raises unless open and (if `started` is not None) started or not.

    Args:
      started: True: must be started; False: must not be; None: either.

    Raises:
      ManagerStateError: saying which, and what to call.
    """
    if os.getpid() != self.pid:
      raise errors.ManagerStateError(
          f'this ReplayBufferManager was created in process {self.pid} and '
          f'is used in process {os.getpid()}, a forked copy: a Reverb client '
          'hangs after fork. Start worker processes with '
          "multiprocessing.get_context('spawn') and build a manager in each "
          "(client mode: server_address=...).")
    if self.closed:
      raise errors.ManagerStateError(
          f'this ReplayBufferManager ({self.backend.where}) is closed; create '
          'a new one.')
    if started and self.client is None:
      raise errors.ManagerStateError(
          'the buffer is not started; call create_replay_buffer() or '
          'load_replay_buffer() first (connect() in client mode).')
    if started is False and self.client is not None:
      raise errors.ManagerStateError(
          'the buffer is already started (server at '
          f'{self.client.server_address}).')

  @property
  def observer(self) -> Optional[observer_lib.TrajectoryObserver]:
    """The first observer (None before start)."""
    return self.observers[0] if self.observers else None

  @property
  def server_address(self) -> Optional[str]:
    """'host:port' of the server (None before start)."""
    return self.client.server_address if self.client else None

  @property
  def table_configs(self) -> List[Any]:
    """The resolved table configs ([] while the config is unknown)."""
    return list(self.config.tables) if self.config else []

  @property
  def buffer_config(self) -> Optional[Dict[str, Any]]:
    """The config as a manifest stores it (None while unknown)."""
    return self.config.to_manifest() if self.config else None

  @property
  def layout(self) -> Optional[str]:
    """'packed' or 'columns' (None while the config is unknown)."""
    return self.config.layout if self.config else None

  @property
  def sequence_length(self) -> Optional[int]:
    """Steps per item (None while the config is unknown)."""
    return self.config.sequence_length if self.config else None

  def known_config(self) -> config_lib.BufferConfig:
    """The config; client mode must be connected to know it.

    Raises:
      ManagerStateError: in client mode before `connect()`, or if closed.
    """
    if self.config is None:
      self.require(started=True)
    return self.config

  def serve(self, client: reverb.Client, **server) -> None:
    """Makes the replay buffer, TF client and first observer of a buffer the
    backend started (see `Hooks.serve`).

    Args:
      client: a client of the started server.
      **server: `local_server=` or `server_address=`.
    """
    config = self.config
    if self._priorities_of is not config:
      self.priorities = priorities_lib.Priorities(config.tables)
      self._priorities_of = config
    first = config.table()
    self.client, self.observers = client, []
    self.replay_buffer = replay_buffer_lib.ManagedReplayBuffer(
        self.data_spec, first.name,
        first.sequence_length if first.kind == 'sequence' else None,
        checkpoint=self._checkpoint, make_dataset=self._make_dataset,
        rate_limiter_timeout_ms=int(self.sample_timeout_s * 1000), **server)
    self.tf_client = reverb.TFClient(client.server_address)
    self.serving.assign(True)
    self.make_observer(num_envs=self.num_envs)

  def hooks(self) -> backend_lib.Hooks:
    """What the backend may ask of this session (see `Hooks`)."""
    return backend_lib.Hooks(
        serve=self.serve, flush=self.flush, lock=self.lock,
        observers=lambda: list(self.observers),
        require_started=lambda: self.require(started=True))

  def resume(self, path: str, manifest: Dict[str, Any]) -> None:
    """Carries on the counts of a loaded checkpoint.

    Args:
      path: the loaded checkpoint folder.
      manifest: its manifest.
    """
    self.loaded_checkpoint, self.loaded_manifest = path, manifest
    counts = manifest['counts']
    self.steps_offset = counts['env_steps']
    self.episodes_offset = counts['episodes']
    self.priorities.restore(counts['tables'])
    logging.info('Loaded replay buffer from %s: %s items, %d env steps.', path,
                 {n: c['items'] for n, c in counts['tables'].items()},
                 counts['env_steps'])

  def clear(self) -> None:
    """Empties every table of the running server; checkpoints are untouched.

    In client mode this empties the shared server's tables for every client.
    Observers are flushed first and their current episode is closed, so
    items written after `clear()` hold only steps written after it. Counters
    in `stats()` restart at zero.

    Raises:
      ManagerStateError: if the manager is not started.
      WaitTimeoutError: if flushing the observers times out.
    """
    with self.lock:
      self.require(started=True)
      for obs in self.observers:
        obs.end_episode()
      for name in self.config.table_names:
        self.client.reset(name)
      for obs in self.observers:
        obs.reset_counters()
      self.steps_offset = self.episodes_offset = 0
      self.priorities.reset()
      self.blocked.clear()

  def open_starter(self, loaded: Optional[Dict[str, Any]]) -> None:
    """Opens the starter asked for (`starter_dir`) or recorded by the loaded
    checkpoint (see `mixing.starter.open_for`).

    Args:
      loaded: `{'path', 'manifest'}` of a loaded checkpoint, or None for a
        new buffer.

    Raises:
      StarterMismatchError: if the starter's fingerprint is not the recorded
        one, or a checkpoint without a starter was asked for one.
    """
    self.starter = starter_lib.open_for(
        self.starter_dir,
        loaded['manifest'].get(starter_lib.MANIFEST_KEY) if loaded else None,
        loading=loaded is not None, where=loaded and loaded['path'],
        connect_timeout_s=self.connect_timeout_s,
        allow_version_mismatch=self._allow_version_mismatch)

  def starter_reference(self) -> Optional[Dict[str, Any]]:
    """What a checkpoint records about the starter (None without one)."""
    return self.starter.reference() if self.starter else None

  def unserve(self) -> None:
    """Stops serving: the backend and the starter stop, clients and observers
    are dropped."""
    self.serving.assign(False)
    if self.starter is not None:
      self.starter.close()
      self.starter = None
    self.backend.stop()
    self.client = self.replay_buffer = self.tf_client = None
    self.observers = []

  def close(self) -> None:
    """Closes the observers and stops the server (client mode: disconnects).

    Safe to call twice. A save still being written is waited for; the server
    (and a starter's) stops even if that or a flush fails, then the error is
    raised.

    Raises:
      WaitTimeoutError: if an observer could not flush in time, or an earlier
        checkpoint did not finish.
      ServerUnavailableError, WriteFailedError: if an observer lost steps.
    """
    with self.lock:
      if self.closed:
        return
      self.closed = True
      failure = None
      for obs in self.observers:
        try:
          obs.close()
        except errors.SmartReplayError as e:
          failure = failure or e
          logging.error('Closing observer failed: %s', e)
      try:
        self.backend.wait_for_pending_save()
      except errors.WaitTimeoutError as e:
        failure = failure or e
        logging.error('%s', e)
      self.unserve()
      self.backend.release()
    if failure:
      raise failure

  def make_observer(self, *, priority: Optional[float] = None,
                    num_envs: Optional[int] = None
                    ) -> observer_lib.TrajectoryObserver:
    """Creates another observer on this buffer (e.g. one per actor thread).

    Args:
      priority: initial priority of its items; None uses each table's
        `initial_priority`, else the table's largest priority so far.
      num_envs: None for unbatched steps; N for batches of N environments'
        steps (one stream, with its own episodes, per environment).

    Returns:
      A `TrajectoryObserver` writing to every table; the manager flushes and
      closes it with the buffer.

    Raises:
      ManagerStateError: if the manager is not started.
      ValueError: if `priority` or `num_envs` is invalid.
    """
    self.require(started=True)
    obs = observer_lib.TrajectoryObserver(
        self.client, tables=list(self.config.tables),
        data_spec=self.data_spec, layout=self.config.step_layout,
        num_envs=num_envs, priority=priority,
        priority_fn=self.new_item_priority, lock=self.lock,
        on_reconnect=self.backend.on_reconnect, **self._observer_args)
    self.observers.append(obs)
    return obs

  def new_item_priority(self, table_name: str) -> float:
    """The priority of new items of a table that sets none (see
    `Priorities.new_item_priority`)."""
    return self.priorities.new_item_priority(table_name)

  def flush(self) -> None:
    """Flushes every observer of this manager.

    Raises:
      WaitTimeoutError: if the server does not accept pending items in time.
      ServerUnavailableError, WriteFailedError: if an observer lost steps
        (see `TrajectoryObserver`).
    """
    for obs in self.observers:
      obs.flush()

  def env_steps(self) -> int:
    """Env steps written through the buffer, with those of a loaded one.

    Boundary steps are not counted (see `counters.Counters.env_steps`).
    """
    return self.steps_offset + sum(o.live_counters.env_steps
                                   for o in self.observers)

  def episodes(self) -> int:
    """Finished episodes likewise."""
    return self.episodes_offset + sum(o.num_episodes for o in self.observers)

  def counts(self) -> Dict[str, Any]:
    """What a checkpoint's manifest counts beside Reverb's table counters."""
    return {'env_steps': self.env_steps(), 'episodes': self.episodes(),
            'tables': {name: {'max_priority': p}
                       for name, p in self.priorities.current().items()}}

  def server_info(self) -> Dict[str, Any]:
    """`server_info()` of the running server, within `connect_timeout_s`.

    Raises:
      WaitTimeoutError: if the server does not answer in time.
    """
    return server_lib.server_info(self.client, self.connect_timeout_s)

  def table_stats(self) -> Dict[str, Dict[str, int]]:
    """Reverb's counters of the buffer's tables (see `stats.table_stats`)."""
    return stats_lib.table_stats(self.server_info(), self.config.table_names)
