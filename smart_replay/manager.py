"""`ReplayBufferManager`: a Reverb replay buffer for TF-Agents that keeps its word.

It never restores a checkpoint silently or lets its stored config override
the requested one, never stores a step that does not match the spec, never
waits without a timeout, and never lets Reverb prune a checkpoint it should
keep. A facade over parts sharing one `core.session`: a backend (in-process
server, or client mode), `core.sampling`, `core.reporting`.
"""

import functools
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from absl import logging
import gin

from smart_replay import backends
from smart_replay import errors
from smart_replay.checkpointing import checkpointer as checkpointer_lib
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


def _read(part: str, attribute: str, doc: str) -> property:
  """A read-only manager property: `attribute` of the manager's `part`."""
  return property(lambda self: getattr(getattr(self, part), attribute),
                  doc=doc)


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
    capacity: default `max_size` of the tables; required unless client mode.
    checkpoint_dir: the buffer directory (see `checkpointing.layout`);
      required unless in client mode (the server writes checkpoints).
    sequence_length: steps per item, >= 1 (default 2).
    stride_length: steps between consecutive item starts, >= 1 (default 1).
    table_configs: the tables (`TableConfig`s, the first the default);
      default one uniform table 'experience'.
    layout: how Reverb stores a step: 'packed' (all fields in one byte
      column: fastest, least memory) or 'columns' (one column per field).
      None: a loaded checkpoint's (or the server's) layout, and for a new
      buffer 'packed' if every field is numeric or boolean of known shape.
    frame_stack: `smart_replay.FrameStack(field, axis)` for a stacked pixel
      observation (e.g. Atari's 4 frames of 84x84): each frame is stored
      once, compressed, and stacks are rebuilt bit-exactly when sampled
      (see README, "Pixel observations"). Needs the packed layout. None: a
      loaded checkpoint's (or the server's), none for a new buffer.
    keep_checkpoints: complete checkpoints to keep on disk, >= 1.
    sample_timeout_s: how long sampling waits for data before raising.
    write_timeout_s: how long observer flushes and episode ends wait.
    connect_timeout_s: how long to wait for the server to answer.
    checkpoint_timeout_s: how long `checkpoint()` waits for Reverb to write.
    port: the server's port; None picks a free one.
    num_envs: N if the first observer gets batches of N envs' steps.
    chunk_length: steps per Reverb chunk; None: `auto_chunk_length`.
    allow_version_mismatch: load checkpoints of other dm-reverb, tensorflow
      or tf-agents versions (with a warning) instead of refusing.
    server_address: client mode: 'host:port' of a standalone server; the
      buffer's config then comes from it, and any given here must match.
    control_address: client mode: the server's control service; default
      the Reverb port + 1.
    reconnect_timeout_s: how long observers retry an unreachable server.
    non_finite: 'error', 'warn' or 'allow' a NaN/Inf in a float field.
    float_bounds: the same for floats outside their bounded spec (default
      'warn'); other bound violations are always refused.
    starter_dir: a starter buffer served read-only beside this one (its
      first table; see `smart_replay.mixing`), for
      `get_dataset(starter_fraction=...)`; checkpoints record it by path and
      fingerprint instead of copying it. Loading such a checkpoint opens the
      recorded starter (at `starter_dir` if given, e.g. after it moved) and
      refuses one with another fingerprint.

  Raises:
    ValueError: if an argument is invalid; the message names it and its value.
  """

  def __init__(self, data_spec: Any, capacity: Optional[int] = None,
               checkpoint_dir: Optional[str] = None,
               sequence_length: Optional[int] = None, *,
               stride_length: Optional[int] = None,
               table_configs: Optional[Sequence[tables_lib.TableConfig]] = None,
               layout: Optional[str] = None,
               frame_stack: Optional[Any] = None,
               keep_checkpoints: int = 2, sample_timeout_s: float = 60.0,
               write_timeout_s: float = 60.0, connect_timeout_s: float = 10.0,
               checkpoint_timeout_s: float = 600.0, port: Optional[int] = None,
               num_envs: Optional[int] = None,
               chunk_length: Optional[int] = None,
               allow_version_mismatch: bool = False,
               server_address: Optional[str] = None,
               control_address: Optional[str] = None,
               reconnect_timeout_s: float = 300.0,
               non_finite: str = 'error', float_bounds: str = 'warn',
               starter_dir: Optional[str] = None):
    if starter_dir is not None and server_address is not None:
      raise ValueError(f'starter_dir={starter_dir!r} needs an in-process '
                       f'buffer; client mode (server_address='
                       f'{server_address!r}) serves no starter table.')
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
        table_configs=table_configs, layout=layout, frame_stack=frame_stack,
        counts={'num_envs': num_envs, 'chunk_length': chunk_length},
        policies={'non_finite': non_finite, 'float_bounds': float_bounds})
    self._session = session = session_lib.Session(
        data_spec, num_envs=num_envs, sample_timeout_s=float(sample_timeout_s),
        connect_timeout_s=float(connect_timeout_s), observer_args={
            'chunk_length': chunk_length, 'non_finite': non_finite,
            'float_bounds': float_bounds, 'timeout_s': float(write_timeout_s),
            'reconnect_timeout_s': float(reconnect_timeout_s)},
        checkpoint=self.checkpoint, make_dataset=self.get_dataset,
        starter_dir=starter_dir,
        allow_version_mismatch=bool(allow_version_mismatch))
    self._backend = session.backend = backends.make_backend(
        data_spec, hooks=session.hooks(), server_address=server_address,
        capacity=capacity, sequence_length=sequence_length,
        stride_length=stride_length, table_configs=table_configs,
        configs=configs, layout=layout, frame_stack=frame_stack,
        checkpoint_dir=checkpoint_dir,
        keep_checkpoints=keep_checkpoints, port=port,
        control_address=control_address, connect_timeout_s=float(
            connect_timeout_s), checkpoint_timeout_s=float(
                checkpoint_timeout_s),
        allow_version_mismatch=bool(allow_version_mismatch))
    self._sampling = sampling.Sampling(session)
    self._reporting = reporting.Reporting(session)

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
      A manager with the manifest's spec, capacity, lengths and tables.

    Raises:
      ValueError: if `kwargs` sets something the manifest decides.
      CheckpointNotFoundError: if there is no checkpoint at `source`.
      CheckpointCorruptError: if no checkpoint there has a readable manifest.
    """
    return cls(**config_lib.from_checkpoint_arguments(source, checkpoint_dir,
                                                      kwargs))

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
    self._start(lambda: self._backend.create(overwrite=overwrite))
    return self._started()

  def load_replay_buffer(self, source: Optional[str] = None, *,
                         overwrite: bool = False) -> Started:
    """Starts a server restored from the newest usable checkpoint.

    The manifest is compared with this manager's config before any server
    starts; a damaged newest checkpoint falls back to an older one (with a
    warning). Another buffer is only read: new checkpoints go here.

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
    loaded = self._start(lambda: self._backend.load(source,
                                                    overwrite=overwrite))
    self._session.resume(loaded['path'], loaded['manifest'])
    return self._started()

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
    self._start(self._backend.connect)
    return self._started()

  def _start(self, start: Callable[[], Any]) -> Any:
    """Runs a backend's start and opens the starter; on failure nothing stays
    served."""
    try:
      loaded = start()
      self._session.open_starter(loaded)
      return loaded
    except BaseException:
      self._session.unserve()
      raise

  def _started(self) -> Started:  # What create/load/connect return.
    return self._session.replay_buffer, self._session.observers[0]

  # Writing, sampling and reading are the parts' (see their docstrings).
  make_observer = _forward('_session', session_lib.Session.make_observer)
  flush = _forward('_session', session_lib.Session.flush)
  clear = _forward('_session', session_lib.Session.clear)
  get_dataset = _forward('_sampling', sampling.Sampling.get_dataset)
  check_prefill = _forward('_sampling', sampling.Sampling.check_prefill)
  update_priorities = _forward('_sampling', sampling.Sampling.update_priorities)
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
      return self._backend.checkpoint(
          extra=extra, counts=self._session.counts,
          starter=self._session.starter_reference())

  def existing_checkpoints(self) -> Sequence[str]:
    """Returns the `ckpt-N` folders in `checkpoint_dir`, oldest first.

    Raises:
      ManagerStateError: in client mode, if not connected.
      ServerUnavailableError: if the server does not answer in time.
    """
    return self._backend.existing_checkpoints()

  # ---------------------------------------------------------------- lifecycle
  replay_buffer = _read('_session', 'replay_buffer', """The TF-Agents replay
      buffer (a `ManagedReplayBuffer`) on the first table (None before
      start).""")
  observer = _read('_session', 'observer', """The observer returned by
      create/load/connect (None before start).""")
  server_address = _read('_session', 'server_address', """'host:port' of the
      running server, or client mode's server (None before start).""")
  checkpoint_dir = _read('_backend', 'checkpoint_dir', """The absolute buffer
      directory (client mode: the server's, once connected).""")
  keep_checkpoints = _read('_backend', 'keep_checkpoints', """Complete
      checkpoints kept on disk (client mode: the server's, once connected).""")
  table_configs = _read('_session', 'table_configs', """The resolved configs
      of the tables, first one the default.""")
  buffer_config = _read('_session', 'buffer_config', """The buffer's
      configuration as a manifest stores it (spec, capacity, lengths,
      tables); in client mode, once connected.""")
  sequence_length = _read('_session', 'sequence_length', 'Steps per item.')
  layout = _read('_session', 'layout', """How Reverb stores a step:
      'packed' or 'columns' (client mode: once connected).""")
  data_spec = _read('_session', 'data_spec',
                    'The spec of one step this buffer stores.')
  loaded_manifest = _read('_session', 'loaded_manifest', """The manifest of
      the checkpoint `load_replay_buffer` restored, or None; its `extra` holds
      what was passed to `checkpoint(extra=...)`.""")
  loaded_checkpoint = _read('_session', 'loaded_checkpoint', """The
      checkpoint folder `load_replay_buffer` restored, or None.""")
  starter = _read('_session', 'starter', """The read-only starter table's
      `mixing.StarterSource` (path, fingerprint, items), or None.""")

  close = _forward('_session', session_lib.Session.close)

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
