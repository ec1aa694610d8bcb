"""`ReplayBufferManager`: a Reverb replay buffer for TF-Agents that keeps its
word.

It never restores a checkpoint silently or lets its stored config override
the requested one, never stores a step that does not match the spec, never
waits without a timeout, and never lets Reverb prune a checkpoint it should
keep. A facade over small parts built from one frozen `ManagerOptions`: a
backend (in-process server, or client mode), `serving` (start, observers,
checkpoints, close), `sampling` and `reporting`, sharing only `state`.
"""

import functools
from typing import Any, Callable, Optional, Sequence

from absl import logging
import gin

from smart_replay import backends
from smart_replay import errors
from smart_replay.config import options as options_lib
from smart_replay.manager import manager_options
from smart_replay.manager import reporting
from smart_replay.manager import sampling
from smart_replay.manager import serving
from smart_replay.manager import state as state_lib

Started = serving.Started


def _read(get: Callable[[Any], Any], doc: str) -> property:
  """A read-only manager property: `get(manager)`."""
  return property(get, doc=doc)


def _forward(part: str, method: Callable[..., Any]) -> Callable[..., Any]:
  """A manager method running `method` of the manager's part `part` (same
  signature and docstring)."""
  @functools.wraps(method)
  def forward(self, *args, **kwargs):
    return method(getattr(self, part), *args, **kwargs)
  return forward


def _config(manager: 'ReplayBufferManager') -> Any:
  """The buffer's config (None in client mode before `connect()`)."""
  return manager._backend.config  # pylint: disable=protected-access


def _running(manager: 'ReplayBufferManager') -> Any:
  """The running buffer (None before start and after close)."""
  return manager._state.running  # pylint: disable=protected-access


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

  The options come in four groups (`smart_replay.config.options`), each a
  frozen dataclass checked when made; pass a group, or its fields as flat
  keyword arguments (as gin bindings do), not both:

  * `shape=BufferShape(...)`: what the buffer is: `capacity` (required
    locally), `sequence_length` (default 2), `stride_length` (default 1),
    `table_configs` (default one uniform table 'experience'), `layout`
    ('packed' or 'columns'; default 'packed' when every field is numeric, or
    a loaded checkpoint's) and `frame_stack` (stacked pixel observations,
    each frame stored once in zstd: None finds the stacked field by its
    shape, `False` stores whole stacks, a `FrameStack` names the field; see
    docs/pixels.md).
  * `location=LocalBuffer(...)`: an in-process server on `checkpoint_dir`
    (`keep_checkpoints` 2, `port` None: a free one, `starter_dir`: a starter
    buffer served read-only beside this one for
    `get_dataset(starter_fraction=...)`, `allow_version_mismatch`);
    or `location=RemoteBuffer(server_address, control_address=None)`, a
    client of a standalone server whose config it reads. Local-only options
    with `server_address` are refused.
  * `writes=WriteOptions(...)`: `num_envs` (N if the first observer gets
    batches of N environments' steps), `chunk_length` (None: automatic),
    `non_finite` ('error', 'warn' or 'allow' a NaN/Inf), `float_bounds`
    (the same for floats outside their bounded spec; default 'warn') and
    `journal` (an in-process buffer's write-ahead journal: 'always',
    'every_second', 'off', or False for none; the default 'auto' is
    'every_second' but none for steps over 4 KiB (images); see
    docs/durability.md), `resend_bytes` (what a client-mode observer keeps
    to send again to a restarted server; 64 MiB).
  * `timeouts=Timeouts(...)`: `sample_timeout_s` 60, `write_timeout_s` 60,
    `connect_timeout_s` 10, `checkpoint_timeout_s` 600,
    `reconnect_timeout_s` 300.

  Args:
    data_spec: spec of one step, e.g. `agent.collect_data_spec`.
    capacity: `shape.capacity`, flat.
    checkpoint_dir: `location.checkpoint_dir`, flat (see `storage.layout`).
    sequence_length: `shape.sequence_length`, flat.
    shape: what the buffer is, or None to build it from flat arguments.
    location: where it lives, or None: a `RemoteBuffer` if `server_address`
      is given, else a `LocalBuffer`.
    writes: how observers write, or None.
    timeouts: the timeouts, or None.
    **options: any other field of the groups, flat (e.g. `stride_length=1`,
      `sample_timeout_s=30.0`, `server_address='host:8000'`).

  Raises:
    ValueError: if an argument is invalid or a combination cannot work; the
      message names it and its value.
    TypeError: if an argument is not an option.
  """

  def __init__(self, data_spec: Any, capacity: Optional[int] = None,
               checkpoint_dir: Optional[str] = None,
               sequence_length: Optional[int] = None, *,
               shape: Optional[options_lib.BufferShape] = None,
               location: Optional[options_lib.Location] = None,
               writes: Optional[options_lib.WriteOptions] = None,
               timeouts: Optional[options_lib.Timeouts] = None,
               **options: Any):
    self._options = opts = manager_options.group_options(
        data_spec, shape=shape, location=location, writes=writes,
        timeouts=timeouts, capacity=capacity, checkpoint_dir=checkpoint_dir,
        sequence_length=sequence_length, **options)
    self._backend = backends.make_backend(
        opts.data_spec, shape=opts.shape, location=opts.location,
        timeouts=opts.timeouts)
    self._state = state_lib.State()
    self._sampling = sampling.Sampling(self._state, opts, self._backend)
    self._serving = serving.Serving(self._state, opts, self._backend,
                                    samples=self._sampling)
    self._reporting = reporting.Reporting(self._state, opts, self._backend)

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
    return cls(**manager_options.from_checkpoint_arguments(
        source, checkpoint_dir, kwargs))

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
    return self._serving.start(
        lambda: self._backend.create(overwrite=overwrite))

  def load_replay_buffer(self, source: Optional[str] = None, *,
                         overwrite: bool = False) -> Started:
    """Starts a server restored from the newest usable checkpoint.

    The manifest is compared with this manager's config before any server
    starts; a damaged newest checkpoint falls back to an older one (with a
    warning). Another buffer is only read: new checkpoints go here.

    A client of a sharded buffer (`server_address=[...]`) connects, then
    brings every shard back to one coordinated checkpoint (each shard
    restores in place; connected writers count what they lose).

    Args:
      source: None for this `checkpoint_dir`; or another buffer directory,
        or one `ckpt-N` folder. Sharded: a coordinated checkpoint id, or
        None for the newest complete one.
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
    return self._serving.start(
        lambda: self._backend.load(source, overwrite=overwrite))

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
    self._state.require(started=False, where=self._backend.where)
    self._backend.require('connect')
    return self._serving.start(self._backend.connect)

  # Writing, sampling and reading are the parts' (see their docstrings).
  make_observer = _forward('_serving', serving.Serving.make_observer)
  flush = _forward('_serving', serving.Serving.flush)
  clear = _forward('_serving', serving.Serving.clear)
  get_dataset = _forward('_sampling', sampling.Sampling.get_dataset)
  check_prefill = _forward('_sampling', sampling.Sampling.check_prefill)
  update_priorities = _forward('_sampling', sampling.Sampling.update_priorities)
  priority_update_fn = _forward('_sampling',
                                sampling.Sampling.priority_update_fn)
  num_frames = _forward('_reporting', reporting.Reporting.num_frames)
  stats = _forward('_reporting', reporting.Reporting.stats)
  num_batches = _forward('_reporting', reporting.Reporting.num_batches)
  epoch = _forward('_reporting', reporting.Reporting.epoch)
  writer_items = _forward('_reporting', reporting.Reporting.writer_items)

  # ------------------------------------------------------------ checkpointing

  checkpoint = _forward('_serving', serving.Serving.checkpoint)

  def existing_checkpoints(self) -> Sequence[str]:
    """Returns the `ckpt-N` folders in `checkpoint_dir`, oldest first.

    Raises:
      ManagerStateError: in client mode, if not connected.
      ServerUnavailableError: if the server does not answer in time.
    """
    return self._backend.existing_checkpoints()

  # ---------------------------------------------------------------- lifecycle
  replay_buffer = _read(lambda m: _running(m) and _running(m).replay_buffer,
                        """The TF-Agents replay buffer (a
      `ManagedReplayBuffer`) on the first table (None before start).""")
  observer = _read(lambda m: _running(m) and _running(m).observers[0],
                   """The observer returned by create/load/connect (None
      before start).""")
  server_address = _read(
      lambda m: _running(m) and _running(m).client.server_address,
      """'host:port' of the running server, or client mode's server (None
      before start).""")
  checkpoint_dir = _read(lambda m: m._backend.checkpoint_dir, """The absolute
      buffer directory (client mode: the server's, once connected).""")
  keep_checkpoints = _read(lambda m: m._backend.keep_checkpoints, """Complete
      checkpoints kept on disk (client mode: the server's, once connected).""")
  table_configs = _read(
      lambda m: list(_config(m).tables) if _config(m) else [],
      'The resolved configs of the tables, first one the default.')
  buffer_config = _read(
      lambda m: _config(m).to_manifest() if _config(m) else None,
      """The buffer's configuration as a manifest stores it (spec, capacity,
      lengths, tables); in client mode, once connected.""")
  sequence_length = _read(
      lambda m: _config(m).sequence_length if _config(m) else None,
      'Steps per item.')
  layout = _read(lambda m: _config(m).layout if _config(m) else None,
                 """How Reverb stores a step: 'packed' or 'columns' (client
      mode: once connected).""")
  data_spec = _read(lambda m: m._options.data_spec,
                    'The spec of one step this buffer stores.')
  options = _read(lambda m: m._options, """The checked options
      (`manager_options.ManagerOptions`: shape, location, writes, timeouts).""")
  loaded_manifest = _read(
      lambda m: m._state.loaded and m._state.loaded['manifest'],
      """The manifest of the checkpoint `load_replay_buffer` restored, or
      None; its `extra` holds what was passed to `checkpoint(extra=...)`.""")
  loaded_checkpoint = _read(
      lambda m: m._state.loaded and m._state.loaded['path'],
      'The checkpoint folder `load_replay_buffer` restored, or None.')
  starter = _read(lambda m: _running(m) and _running(m).starter, """The
      read-only starter table's `StarterSource` (path, fingerprint, items),
      or None.""")

  close = _forward('_serving', serving.Serving.close)

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
