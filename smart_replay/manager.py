"""`ReplayBufferManager`: a Reverb replay buffer for TF-Agents that keeps its word.

Data flows one way: spec -> `BufferConfig` -> server -> observer / dataset ->
checkpoint. It never restores a checkpoint silently, never lets a checkpoint's
stored config override the requested one, never stores a step that does not
match the spec, never waits without a timeout, and never lets Reverb's pruning
delete a checkpoint it should keep.

The manager is a facade over small parts sharing one `core.session.Session`:
a backend (`smart_replay.backends`) owns where the server lives (in process on
a buffer directory, or in client mode a standalone `smart-replay-serve`
server), `core.sampling.Sampling` makes datasets and updates priorities,
`core.reporting.Reporting` counts and reads the tables, and saving is
`checkpointing.checkpointer.Checkpointer`.
"""

import functools
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from absl import logging
import gin

from smart_replay import backends
from smart_replay import errors
from smart_replay.backends import base as backend_lib
from smart_replay.checkpointing import checkpointer as checkpointer_lib
from smart_replay.checkpointing import layout
from smart_replay.core import config as config_lib
from smart_replay.core import observer as observer_lib
from smart_replay.core import replay_buffer as replay_buffer_lib
from smart_replay.core import reporting
from smart_replay.core import sampling
from smart_replay.core import session as session_lib
from smart_replay.core import specs
from smart_replay.core import tables as tables_lib

Started = Tuple[replay_buffer_lib.ManagedReplayBuffer,
                observer_lib.TrajectoryObserver]


def _forward(part: str, method: Callable[..., Any]) -> Callable[..., Any]:
  """A manager method running `method` of the manager's part `part` (same
  signature and docstring)."""
  @functools.wraps(method)
  def forward(self, *args, **kwargs):
    return method(getattr(self, part), *args, **kwargs)
  return forward


@gin.configurable
class ReplayBufferManager:
  """Creates, loads, samples, clears and checkpoints a Reverb replay buffer.

  Typical use::

      manager = ReplayBufferManager(data_spec=agent.collect_data_spec,
                                    capacity=50_000, sequence_length=2,
                                    checkpoint_dir='buffers/run1')
      replay_buffer, observer = manager.create_replay_buffer()
      dataset = manager.get_dataset(batch_size=64, num_steps=2)
      path = manager.checkpoint()
      manager.close()

  In client mode (`server_address='host:port'` of a `smart-replay-serve`
  server, no `checkpoint_dir`), `connect()` replaces create/load.

  Args:
    data_spec: spec of one step, e.g. `agent.collect_data_spec`.
    capacity: items of the default table (and `max_size` of every table
      config without one). Required unless in client mode.
    checkpoint_dir: this buffer's directory (see `checkpointing.layout`).
      Required unless in client mode (the server writes checkpoints).
    sequence_length: steps per item, >= 1 (default 2).
    stride_length: steps between consecutive item starts, >= 1 (default 1).
    table_configs: the tables (see `TableConfig`); default one uniform table
      'experience'. The first is the default of `replay_buffer`,
      `num_frames()` and `get_dataset()`.
    keep_checkpoints: complete checkpoints to keep on disk, >= 1.
    sample_timeout_s: how long sampling waits for data before raising.
    write_timeout_s: how long observer flushes and episode ends wait.
    connect_timeout_s: how long to wait for the server to answer.
    checkpoint_timeout_s: how long `checkpoint()` waits for Reverb to write.
    port: the server's port; None picks a free one.
    num_envs: None for unbatched steps; N if the first observer receives
      batches of N environments' steps.
    chunk_length: steps per Reverb chunk; None picks
      `observer.auto_chunk_length(data_spec)`.
    allow_version_mismatch: load checkpoints written with other dm-reverb,
      tensorflow or tf-agents versions (with a warning) instead of refusing.
    server_address: client mode: 'host:port' of a standalone server; the
      buffer's config then comes from it, and any given here must match.
    control_address: client mode: the server's control service; default
      the Reverb port + 1.
    reconnect_timeout_s: how long observers retry an unreachable server
      before raising `ServerUnavailableError` (counting lost steps).
    non_finite: 'error', 'warn' or 'allow' a NaN/Inf in a float field.
    float_bounds: the same for floats outside their bounded spec (default
      'warn'); other bound violations are always refused.

  Raises:
    ValueError: if an argument is invalid; the message names it and its value.
  """

  def __init__(self, data_spec: Any, capacity: Optional[int] = None,
               checkpoint_dir: Optional[str] = None,
               sequence_length: Optional[int] = None, *,
               stride_length: Optional[int] = None,
               table_configs: Optional[Sequence[tables_lib.TableConfig]] = None,
               keep_checkpoints: int = 2, sample_timeout_s: float = 60.0,
               write_timeout_s: float = 60.0, connect_timeout_s: float = 10.0,
               checkpoint_timeout_s: float = 600.0, port: Optional[int] = None,
               num_envs: Optional[int] = None,
               chunk_length: Optional[int] = None,
               allow_version_mismatch: bool = False,
               server_address: Optional[str] = None,
               control_address: Optional[str] = None,
               reconnect_timeout_s: float = 300.0,
               non_finite: str = 'error', float_bounds: str = 'warn'):
    data_spec = specs.as_trajectory(data_spec)
    specs.validate_trajectory_spec(data_spec)
    configs = config_lib.check_manager_arguments(
        server_address=server_address, capacity=capacity,
        checkpoint_dir=checkpoint_dir, port=port,
        lengths={'capacity': capacity, 'sequence_length': sequence_length,
                 'stride_length': stride_length},
        timeouts={'sample_timeout_s': sample_timeout_s,
                  'write_timeout_s': write_timeout_s,
                  'connect_timeout_s': connect_timeout_s,
                  'checkpoint_timeout_s': checkpoint_timeout_s,
                  'reconnect_timeout_s': reconnect_timeout_s},
        table_configs=table_configs,
        counts={'num_envs': num_envs, 'chunk_length': chunk_length},
        policies={'non_finite': non_finite, 'float_bounds': float_bounds})
    self._session = session = session_lib.Session(
        data_spec, num_envs=num_envs, sample_timeout_s=float(sample_timeout_s),
        connect_timeout_s=float(connect_timeout_s), observer_args={
            'chunk_length': chunk_length, 'non_finite': non_finite,
            'float_bounds': float_bounds, 'timeout_s': float(write_timeout_s),
            'reconnect_timeout_s': float(reconnect_timeout_s)},
        checkpoint=self.checkpoint, make_dataset=self.get_dataset)
    self._backend = session.backend = backends.make_backend(
        data_spec, hooks=backend_lib.Hooks(
            serve=session.serve, flush=session.flush, lock=session.lock,
            observers=lambda: list(session.observers),
            require_started=lambda: session.require(started=True)),
        server_address=server_address, capacity=capacity,
        sequence_length=sequence_length, stride_length=stride_length,
        table_configs=table_configs, configs=configs,
        checkpoint_dir=checkpoint_dir, keep_checkpoints=keep_checkpoints,
        port=port, control_address=control_address,
        connect_timeout_s=float(connect_timeout_s),
        checkpoint_timeout_s=float(checkpoint_timeout_s),
        allow_version_mismatch=bool(allow_version_mismatch))
    self._sampling = sampling.Sampling(session)
    self._reporting = reporting.Reporting(session)
    self._loaded = {'path': None, 'manifest': None}

  @classmethod
  def from_checkpoint(cls, source: str, *, checkpoint_dir: Optional[str] = None,
                      **kwargs) -> 'ReplayBufferManager':
    """Builds an unstarted manager configured like the newest checkpoint.

    Args:
      source: a buffer directory or one `ckpt-N` folder.
      checkpoint_dir: where this manager writes; default the buffer directory
        of `source` (pass another to train from a starter buffer, then call
        `load_replay_buffer(source)`).
      **kwargs: other `ReplayBufferManager` arguments (timeouts, ...).

    Returns:
      A `ReplayBufferManager` with the manifest's spec, capacity, lengths
      and table configs.

    Raises:
      ValueError: if `kwargs` sets something the manifest decides.
      CheckpointNotFoundError: if there is no checkpoint at `source`.
      CheckpointCorruptError: if no checkpoint there has a readable manifest.
    """
    controlled = sorted(set(kwargs) & {'data_spec', 'capacity',
                                       'sequence_length', 'stride_length',
                                       'table_configs'})
    if controlled:
      raise ValueError(f'from_checkpoint reads {controlled} from the '
                       "checkpoint's manifest; do not pass them (construct "
                       'ReplayBufferManager directly to change them).')
    candidates = layout.find_checkpoints(source)
    stored = layout.first_usable(candidates, layout.read_manifest,
                                 failure=f'no readable manifest in {source}')
    config = config_lib.BufferConfig.from_manifest(stored)
    return cls(data_spec=config.data_spec, checkpoint_dir=checkpoint_dir or
               layout.buffer_dir_of(candidates[0]),
               **config.constructor_kwargs(), **kwargs)

  # ----------------------------------------------------------------- start-up

  def create_replay_buffer(self, *, overwrite: bool = False) -> Started:
    """Starts a server with an empty buffer.

    Args:
      overwrite: replace the checkpoints in `checkpoint_dir` (deleted once
        the new buffer is up, kept if starting it fails).

    Returns:
      `(replay_buffer, observer)`: a `ManagedReplayBuffer` (a TF-Agents
      `ReverbReplayBuffer`) on the first table, and an observer for
      `tf_agents.train.Actor`.

    Raises:
      CheckpointExistsError: if `checkpoint_dir` holds checkpoints and
        `overwrite` is False.
      ManagerStateError: if already started or closed, or in client mode.
      CheckpointCorruptError: if the new server is not empty.
      ValueError: if the configured `port` is in use.
      WaitTimeoutError: if the new server does not answer in time.
      FileExistsError: if an earlier interrupted overwrite left `.replaced/`.
      BufferInUseError: if another manager has `checkpoint_dir` open.
    """
    self._backend.require('create_replay_buffer')
    self._session.require(started=False)
    return self._start(lambda: self._backend.create(overwrite=overwrite))

  def load_replay_buffer(self, source: Optional[str] = None, *,
                         overwrite: bool = False) -> Started:
    """Starts a server restored from the newest usable checkpoint.

    The manifest is compared with this manager's configuration before any
    server starts; a damaged newest checkpoint falls back to an older one
    with a warning. Another buffer is only read: new checkpoints go to this
    manager's `checkpoint_dir`.

    Args:
      source: None for this `checkpoint_dir`; or another buffer directory,
        or one `ckpt-N` folder.
      overwrite: when `source` is another buffer, replace the checkpoints in
        `checkpoint_dir` (deleted only once the load succeeded).

    Returns:
      `(replay_buffer, observer)` as in `create_replay_buffer`.

    Raises:
      CheckpointNotFoundError: if there is no checkpoint at `source`.
      ManifestMismatchError: if the checkpoint has another spec, lengths,
        capacity, table config or package versions; lists every difference.
      CheckpointCorruptError: if no checkpoint at `source` is usable.
      CheckpointExistsError: if loading another buffer into a non-empty
        `checkpoint_dir` without `overwrite`.
      ManagerStateError, ValueError, WaitTimeoutError, BufferInUseError: as
        `create_replay_buffer`.
    """
    self._backend.require('load_replay_buffer')
    self._session.require(started=False)
    loaded = {}
    started = self._start(lambda: loaded.update(self._backend.load(
        source, overwrite=overwrite)))
    counts = loaded['manifest']['counts']
    session = self._session
    session.steps_offset = counts['env_steps']
    session.episodes_offset = counts['episodes']
    session.priorities.restore(counts['tables'])
    self._loaded = loaded
    logging.info('Loaded replay buffer from %s: %s items, %d env steps.',
                 loaded['path'],
                 {n: c['items'] for n, c in counts['tables'].items()},
                 counts['env_steps'])
    return started

  def connect(self) -> Started:
    """Client mode: connects to the standalone server at `server_address`.

    The buffer's configuration is read from the server; the local
    `data_spec` (and any lengths or table configs given) must match it.

    Returns:
      `(replay_buffer, observer)` as in `create_replay_buffer`; the observer
      survives a server restart (see `reconnect_timeout_s`).

    Raises:
      ServerUnavailableError: if the server or its control service does not
        answer within `connect_timeout_s`; names the address.
      ManifestMismatchError: if the server's spec or tables differ from the
        local ones; lists every difference (server value, local value).
      ManagerStateError: if not in client mode, or already started or closed.
      RuntimeError: if the server's control service fails otherwise.
    """
    self._session.require(started=False)
    self._backend.require('connect')
    return self._start(self._backend.connect)

  def _start(self, start: Callable[[], Any]) -> Started:
    """Runs a backend's start; on failure nothing stays served."""
    try:
      start()
    except BaseException:
      self._session.unserve()
      raise
    return self._session.replay_buffer, self._session.observers[0]

  # Writing, sampling and reading are the parts' (see their docstrings).
  make_observer = _forward('_session', session_lib.Session.make_observer)
  flush = _forward('_session', session_lib.Session.flush)
  get_dataset = _forward('_sampling', sampling.Sampling.get_dataset)
  check_prefill = _forward('_sampling', sampling.Sampling.check_prefill)
  update_priorities = _forward('_sampling',
                               sampling.Sampling.update_priorities)
  priority_update_fn = _forward('_sampling',
                                sampling.Sampling.priority_update_fn)
  num_frames = _forward('_reporting', reporting.Reporting.num_frames)
  stats = _forward('_reporting', reporting.Reporting.stats)
  num_batches = _forward('_reporting', reporting.Reporting.num_batches)
  epoch = _forward('_reporting', reporting.Reporting.epoch)

  # ------------------------------------------------------------ checkpointing

  def checkpoint(self, *, extra: Optional[Dict[str, Any]] = None) -> str:
    """Flushes the observers and writes a verified checkpoint.

    Writing through this manager pauses meanwhile, so the manifest's counts
    describe exactly what was saved. In client mode the server writes it into
    its own directory (the path is on its machine).

    Args:
      extra: JSON-serializable metadata for the manifest, e.g.
        `{'train_step': 1000}`.

    Returns:
      The checkpoint folder, `checkpoint_dir/checkpoints/ckpt-N`.

    Raises:
      ValueError: if `extra` is not JSON-serializable (names the key).
      WaitTimeoutError: if flushing or writing exceeds the timeouts, or an
        earlier timed-out save is still being written.
      CheckpointWriteError: if the save failed (names path and cause);
        nothing of it is left and the buffer keeps serving.
      CheckpointCorruptError: if Reverb's output is missing or incomplete.
      ManagerStateError: if the manager is not started.
      ServerUnavailableError: in client mode, if the server does not answer
        within 3 x checkpoint_timeout_s.
    """
    checkpointer_lib.check_extra(extra)
    with self._session.lock:
      self._session.require(started=True)
      return self._backend.checkpoint(extra=extra,
                                      counts=self._session.counts)

  def existing_checkpoints(self) -> Sequence[str]:
    """Returns the `ckpt-N` folders in `checkpoint_dir`, oldest first.

    Raises:
      ManagerStateError: in client mode, if not connected.
      ServerUnavailableError: if the server does not answer in time.
    """
    return self._backend.existing_checkpoints()

  # ---------------------------------------------------------------- lifecycle

  @property
  def replay_buffer(self) -> replay_buffer_lib.ManagedReplayBuffer:
    """The TF-Agents replay buffer on the first table (None before start)."""
    return self._session.replay_buffer

  @property
  def observer(self) -> Optional[observer_lib.TrajectoryObserver]:
    """The observer returned by create/load/connect (None before start)."""
    observers = self._session.observers
    return observers[0] if observers else None

  @property
  def server_address(self) -> Optional[str]:
    """'host:port' of the server (None before start)."""
    client = self._session.client
    return client.server_address if client else None

  @property
  def checkpoint_dir(self) -> Optional[str]:
    """The absolute buffer directory (client mode: the server's, once
    connected)."""
    return self._backend.checkpoint_dir

  @property
  def keep_checkpoints(self) -> Optional[int]:
    """Complete checkpoints kept on disk (client mode: once connected)."""
    return self._backend.keep_checkpoints

  @property
  def table_configs(self) -> Sequence[tables_lib.TableConfig]:
    """The resolved table configs, the default first."""
    config = self._backend.config
    return list(config.tables) if config else []

  @property
  def buffer_config(self) -> Optional[Dict[str, Any]]:
    """The configuration as a manifest stores it (client mode: once
    connected)."""
    config = self._backend.config
    return config.to_manifest() if config else None

  @property
  def sequence_length(self) -> Optional[int]:
    """Steps per item (client mode: once connected)."""
    config = self._backend.config
    return config.sequence_length if config else None

  @property
  def data_spec(self) -> Any:
    """The spec of one step this buffer stores."""
    return self._session.data_spec

  @property
  def loaded_manifest(self) -> Optional[Dict[str, Any]]:
    """The manifest `load_replay_buffer` restored (its `extra` holds what was
    passed to `checkpoint(extra=...)`), or None."""
    return self._loaded['manifest']

  @property
  def loaded_checkpoint(self) -> Optional[str]:
    """The checkpoint folder `load_replay_buffer` restored, or None."""
    return self._loaded['path']

  def clear(self) -> None:
    """Empties every table (client mode: for every client); checkpoints stay.

    Observers are flushed and their episodes closed first; `stats()` counters
    restart at zero.

    Raises:
      ManagerStateError: if the manager is not started.
      WaitTimeoutError: if flushing the observers times out.
    """
    session = self._session
    with session.lock:
      session.require(started=True)
      for obs in session.observers:
        obs.end_episode()
      for name in session.config.table_names:
        session.client.reset(name)
      for obs in session.observers:
        obs.reset_counters()
      session.steps_offset = session.episodes_offset = 0
      session.priorities.reset()
      session.blocked.clear()

  def close(self) -> None:
    """Flushes and closes the observers, then stops the server (client mode:
    disconnects). Safe to call twice.

    A checkpoint still being written is waited for (`checkpoint_timeout_s`);
    the server is stopped even if that or a flush fails, then it raises.

    Raises:
      WaitTimeoutError: if an observer could not flush in time, or an earlier
        checkpoint did not finish.
      ServerUnavailableError, WriteFailedError: if an observer lost steps.
    """
    session = self._session
    with session.lock:
      if session.closed:
        return
      session.closed = True
      failure = None
      for obs in session.observers:
        try:
          obs.close()
        except errors.SmartReplayError as e:
          failure = failure or e
          logging.error('Closing observer failed: %s', e)
      try:
        self._backend.wait_for_pending_save()
      except errors.WaitTimeoutError as e:
        failure = failure or e
        logging.error('%s', e)
      session.unserve()
      self._backend.release()
    if failure:
      raise failure

  def __enter__(self) -> 'ReplayBufferManager':
    """Returns the manager itself; `close()` runs on leaving the block."""
    return self

  def __exit__(self, exc_type, exc_value, traceback) -> None:
    """Closes the manager; a close error never masks an error in the block."""
    try:
      self.close()
    except errors.SmartReplayError as e:
      if exc_type is None:
        raise
      logging.error('While handling %s, close() failed: %s', exc_type.__name__,
                    e)
