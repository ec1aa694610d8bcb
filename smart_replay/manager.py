"""`ReplayBufferManager`: a Reverb replay buffer for TF-Agents that keeps its word.

Data flows one way: spec -> table configs -> server -> observer / dataset ->
checkpoint. The manager owns one in-process Reverb server and fixes what plain
Reverb gets wrong by default: it never restores a checkpoint silently, never
lets a checkpoint's stored config override the requested one, never stores a
step that does not match the spec, never waits without a timeout, and never lets
Reverb's pruning delete a checkpoint it should keep.

In client mode (`server_address=`) it owns no server: it connects to a
standalone server (`smart-replay-serve`, see `smart_replay.remote.replay_server`), checks that
the server's tables match the local spec, and offers the same observers,
datasets, priorities, stats and checkpoints over the network.
"""

import collections
import concurrent.futures
import contextlib
import json
import math
import os
import shutil
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

from absl import logging
import gin
import numpy as np
import portpicker
import reverb
import tensorflow as tf
from tf_agents.replay_buffers import reverb_replay_buffer

from smart_replay.checkpointing import lock as buffer_lock
from smart_replay.checkpointing import files as checkpoint_files
from smart_replay.checkpointing import reader as checkpoint_reader
from smart_replay.checkpointing import store as checkpoint_store
from smart_replay.checkpointing import layout as checkpoints_lib
from smart_replay.remote import control as control_lib
from smart_replay.core import dataset as dataset_lib
from smart_replay import errors
from smart_replay.core import replay_buffer as managed_client
from smart_replay.checkpointing import manifest as manifest_lib
from smart_replay.core import observer as observer_lib
from smart_replay.core import local_server as server_lib
from smart_replay.core import specs
from smart_replay.core import validation as step_validation
from smart_replay.core import tables as tables_lib


def _max_items(config: tables_lib.TableConfig, steps: int,
               streams: int) -> int:
  """The most items `steps` steps over `streams` streams can make."""
  if config.kind == 'episode':
    return steps  # One-step episodes, at worst.
  # An episode of n >= L steps makes floor((n - L) / stride) + 1 items, at
  # most n / min(stride, L); each stream rounds up once.
  per = min(config.stride_length, config.sequence_length)
  return -(-steps // per) + streams - 1


def _config_kwargs(config: Dict[str, Any]) -> Dict[str, Any]:
  """The constructor arguments a stored buffer config (manifest) decides."""
  return {'capacity': config['capacity'],
          'sequence_length': config['sequence_length'],
          'stride_length': config['stride_length'],
          'table_configs': [tables_lib.TableConfig(**t)
                            for t in config['tables']]}


def _positive(name: str, value, *, integer: bool = False):
  kind = int if integer else (int, float)
  if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
    expected = 'a positive integer' if integer else 'a positive number'
    raise ValueError(f'{name} must be {expected}, got {value!r}.')


@gin.configurable
class ReplayBufferManager:
  """Creates, loads, samples, clears and checkpoints a Reverb replay buffer.

  Typical use::

      manager = ReplayBufferManager(data_spec=agent.collect_data_spec,
                                    capacity=50_000,
                                    checkpoint_dir='buffers/run1',
                                    sequence_length=2)
      replay_buffer, observer = manager.create_replay_buffer()
      dataset = manager.get_dataset(batch_size=64, num_steps=2)
      path = manager.checkpoint()
      manager.close()

  In client mode, with `server_address='host:port'` of a `smart-replay-serve`
  server and no `checkpoint_dir`, `connect()` replaces create/load::

      manager = ReplayBufferManager(data_spec=agent.collect_data_spec,
                                    server_address='buffer-host:8000')
      replay_buffer, observer = manager.connect()

  Args:
    data_spec: spec of one step, e.g. `agent.collect_data_spec` (nested
      structures, dict observations and `policy_info` are fine).
    capacity: items the default table holds (and the default `max_size` of
      every table config without one). Required unless in client mode.
    checkpoint_dir: this buffer's directory; checkpoints are written to
      `checkpoint_dir/checkpoints/ckpt-N` (see `smart_replay.checkpointing.layout`).
      Required unless in client mode, where the server writes checkpoints to
      its own directory.
    sequence_length: steps per item, >= 1 (default 2).
    stride_length: steps between consecutive item starts, >= 1 (default 1).
    table_configs: the tables to serve (see `TableConfig`: uniform,
      prioritized, FIFO/LIFO queues, rate limiters, sequence or episode
      items); default one uniform table named 'experience'. Observers write
      every step once and make every table's items from it; the first table
      is the one `replay_buffer`, `num_frames()` and `get_dataset()` use by
      default.
    keep_checkpoints: complete checkpoints to keep on disk, >= 1.
    sample_timeout_s: how long sampling waits for data before raising.
    write_timeout_s: how long observer flushes and episode ends wait for the
      server to accept items before raising.
    connect_timeout_s: how long to wait for the server to answer.
    checkpoint_timeout_s: how long `checkpoint()` waits for Reverb to write.
    port: the server's port; None picks a free one.
    num_envs: None if actors step one environment; N if the observer
      returned by create/load/connect receives batches of N environments'
      steps (batched or parallel TF-Agents environments).
    chunk_length: steps per Reverb chunk of each field, written by the
      observers; None picks `observer.auto_chunk_length(data_spec)` (32 steps
      for small steps, fewer for large ones). Longer chunks write and
      checkpoint faster; items reach the server when their chunk is complete,
      at each episode end and on `flush()`.
    allow_version_mismatch: load checkpoints written with other dm-reverb,
      tensorflow or tf-agents versions (with a warning) instead of refusing.
    server_address: client mode: 'host:port' of a standalone server started
      by `smart-replay-serve`. Capacity, lengths and table configs then come
      from the server; any of them given here must match it.
    control_address: client mode: 'host:port' of the server's control service
      (checkpoints, configuration); default the Reverb port + 1.
    reconnect_timeout_s: how long observers keep retrying while the server is
      unreachable (e.g. restarting) before they raise
      `ServerUnavailableError` and count the unconfirmed steps as lost.
    non_finite: what the observers do with a step holding NaN or +-Inf in a
      floating field: 'error' (refuse it with `TrajectorySpecError`), 'warn'
      (write it, log once per field) or 'allow' (see `TrajectoryObserver`).
    float_bounds: the same for finite floats outside their bounded spec's
      bounds (default 'warn': specs of continuous observations are often
      loose). Step types other than FIRST/MID/LAST and integers outside their
      bounds are always refused.

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
               checkpoint_timeout_s: float = 600.0,
               port: Optional[int] = None,
               num_envs: Optional[int] = None,
               chunk_length: Optional[int] = None,
               allow_version_mismatch: bool = False,
               server_address: Optional[str] = None,
               control_address: Optional[str] = None,
               reconnect_timeout_s: float = 300.0,
               non_finite: str = 'error', float_bounds: str = 'warn'):
    data_spec = specs.as_trajectory(data_spec)
    specs.validate_trajectory_spec(data_spec)
    remote = server_address is not None
    if remote:
      if not isinstance(server_address, str) or ':' not in server_address:
        raise ValueError(f"server_address must be 'host:port', got "
                         f'{server_address!r}.')
      if checkpoint_dir is not None or port is not None:
        raise ValueError(
            f'client mode (server_address={server_address!r}) has no local '
            f'server: checkpoint_dir ({checkpoint_dir!r}) and port '
            f'({port!r}) belong to smart-replay-serve; leave them None.')
    elif capacity is None or checkpoint_dir is None:
      raise ValueError(
          f'capacity ({capacity!r}) and checkpoint_dir ({checkpoint_dir!r}) '
          'are required, unless server_address= connects to a standalone '
          'server (binaries: bind ReplayBufferManager.capacity in a gin '
          'file).')
    for name, value in (('capacity', capacity),
                        ('sequence_length', sequence_length),
                        ('stride_length', stride_length)):
      if value is not None:
        _positive(name, value, integer=True)
    for name, value in (('sample_timeout_s', sample_timeout_s),
                        ('write_timeout_s', write_timeout_s),
                        ('connect_timeout_s', connect_timeout_s),
                        ('checkpoint_timeout_s', checkpoint_timeout_s),
                        ('reconnect_timeout_s', reconnect_timeout_s)):
      _positive(name, value)
    if not remote and (not isinstance(checkpoint_dir, (str, os.PathLike)) or
                       not str(checkpoint_dir)):
      raise ValueError(f'checkpoint_dir must be a non-empty path, got '
                       f'{checkpoint_dir!r}.')
    configs = list(table_configs or [tables_lib.TableConfig()])
    for config in configs:
      if not isinstance(config, tables_lib.TableConfig):
        raise ValueError(f'table_configs entries must be TableConfig, got '
                         f'{config!r}.')
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
      raise ValueError(f'table_configs names must be unique, got {names}.')
    if num_envs is not None:
      _positive('num_envs', num_envs, integer=True)
    if chunk_length is not None:
      _positive('chunk_length', chunk_length, integer=True)
    for name, value in (('non_finite', non_finite),
                        ('float_bounds', float_bounds)):
      if value not in step_validation.VALUE_POLICIES:
        raise ValueError(f'{name} must be one of '
                         f'{step_validation.VALUE_POLICIES}, got {value!r}.')

    self._data_spec = data_spec
    self._num_envs = num_envs
    self._chunk_length = chunk_length
    self._value_policies = {'non_finite': non_finite,
                            'float_bounds': float_bounds}
    self._sample_timeout_s = float(sample_timeout_s)
    self._write_timeout_s = float(write_timeout_s)
    self._connect_timeout_s = float(connect_timeout_s)
    self._checkpoint_timeout_s = float(checkpoint_timeout_s)
    self._reconnect_timeout_s = float(reconnect_timeout_s)
    self._port = port
    self._allow_version_mismatch = bool(allow_version_mismatch)
    self._server_address = server_address
    self._control_address = control_address or (
        control_lib.control_address_for(server_address) if remote else None)
    self._control = None
    self._served = None  # The server's 'info' answer (client mode).
    # What the caller asked for; in client mode the server's config fills in
    # the rest at connect() and must agree with these.
    self._requested = {'capacity': capacity,
                       'sequence_length': sequence_length,
                       'stride_length': stride_length,
                       'table_configs': list(table_configs)
                                        if table_configs else None}
    self._store = None
    if remote:
      self._where = f'the server at {server_address}'
      self._forget_config()
    else:
      self._configure(capacity=capacity, sequence_length=sequence_length or 2,
                      stride_length=stride_length or 1, table_configs=configs)
      self._store = checkpoint_store.CheckpointStore(str(checkpoint_dir),
                                                     keep=keep_checkpoints)
      self._where = self._store.root
    # Held from create/load until close(): one writer per buffer directory.
    self._dir_lock = (buffer_lock.BufferLock(self._store.root)
                      if self._store else None)
    self._pid = os.getpid()
    self._server = None
    self._client = None
    self._replay_buffer = None
    self._observers = []
    self._steps_offset = 0
    self._episodes_offset = 0
    self._closed = False
    # Held while a step is written, and by checkpoint/clear/close, so that a
    # checkpoint sees whole steps and its counts match its data.
    self._lock = threading.RLock()
    self._save_pool = concurrent.futures.ThreadPoolExecutor(
        1, thread_name_prefix='smart_replay_checkpoint')
    self._pending_save = None
    self._loaded_manifest = None
    self._loaded_checkpoint = None
    self._tf_client = None
    self._blocked_since = {}
    # False once closed: a traced update_priorities then fails instead of
    # waiting forever on the stopped server.
    self._serving = tf.Variable(False, trainable=False, name='serving')

  def _forget_config(self) -> None:
    """Client mode before `connect()`: the server's config is not known."""
    self._sequence_length = self._stride_length = self._config = None
    self._table_configs, self._max_priority = [], {}

  def _configure(self, *, capacity: int, sequence_length: int,
                 stride_length: int,
                 table_configs: Sequence[tables_lib.TableConfig]) -> None:
    """Resolves the table configs; sets what the buffer's config decides."""
    self._sequence_length = sequence_length
    self._stride_length = stride_length
    self._table_configs = [
        c.resolve(capacity=capacity, sequence_length=sequence_length,
                  stride_length=stride_length) for c in table_configs]
    self._config = manifest_lib.build_config(
        data_spec=self._data_spec, sequence_length=sequence_length,
        stride_length=stride_length, capacity=capacity,
        table_configs=self._table_configs)
    # Largest priority given per prioritized table: new items get it unless
    # their table sets initial_priority. Variables, so that update_priorities
    # can raise them from inside a Learner's tf.function.
    self._max_priority = {
        c.name: tf.Variable(1.0, dtype=tf.float64, trainable=False,
                            name=f'max_priority_{i}')
        for i, c in enumerate(self._table_configs) if c.prioritized}

  @classmethod
  def from_checkpoint(cls, source: str, *, checkpoint_dir: Optional[str] = None,
                      **kwargs) -> 'ReplayBufferManager':
    """Builds a manager configured like the newest checkpoint at `source`.

    Spec, capacity, sequence and stride length and table configs are read
    from the checkpoint's manifest instead of being guessed.

    Args:
      source: a buffer directory or one `ckpt-N` folder.
      checkpoint_dir: where this manager writes; default the buffer directory
        of `source` (continue in place). Pass another directory to train from
        a starter buffer without touching it, then call
        `load_replay_buffer(source)`.
      **kwargs: other `ReplayBufferManager` arguments (timeouts, ...).

    Returns:
      An unstarted `ReplayBufferManager`.

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
    candidates = checkpoints_lib.find_checkpoints(source)
    if checkpoint_dir is None:
      checkpoint_dir = checkpoints_lib.buffer_dir_of(candidates[0])
    problems = []
    for path in candidates:
      try:
        stored = manifest_lib.read(os.path.join(path,
                                                manifest_lib.MANIFEST_NAME))
      except (OSError, ValueError) as e:
        problems.append(f'{path}: {e}')
        continue
      return cls(data_spec=specs.spec_from_json(stored['data_spec']),
                 checkpoint_dir=checkpoint_dir, **_config_kwargs(stored),
                 **kwargs)
    raise errors.CheckpointCorruptError(
        f'no readable manifest in {source}: ' + ' | '.join(problems))

  # ----------------------------------------------------------------- start-up

  def create_replay_buffer(self, *, overwrite: bool = False
                           ) -> Tuple[reverb_replay_buffer.ReverbReplayBuffer,
                                      observer_lib.TrajectoryObserver]:
    """Starts a server with an empty buffer.

    Args:
      overwrite: replace the checkpoints already in `checkpoint_dir` instead of
        refusing to start; they are deleted once the new buffer is up, and
        kept if starting it fails.

    Returns:
      `(replay_buffer, observer)`: a TF-Agents `ReverbReplayBuffer` on the
      first table, and an observer for `tf_agents.train.Actor`.

    Raises:
      CheckpointExistsError: if `checkpoint_dir` already holds checkpoints and
        `overwrite` is False.
      ManagerStateError: if the manager is already started or closed.
      CheckpointCorruptError: if the new server is not empty.
      ValueError: if the configured `port` is in use.
      WaitTimeoutError: if the new server does not answer in time.
      FileExistsError: if an earlier interrupted overwrite left `.replaced/`.
      BufferInUseError: if another manager (this process or another) has
        `checkpoint_dir` open; names its pid, host and start time.
    """
    self._require_local('create_replay_buffer')
    self._require_state(started=False)
    self._check_port()
    with self._locked_start():
      existing = self._store.existing_data()
      if existing and not overwrite:
        raise errors.CheckpointExistsError(
            f'{self._store.root} already holds a replay buffer checkpoint '
            f'({existing[-1]}); Reverb would silently restore it. Call '
            'load_replay_buffer() to continue that buffer, or pass '
            'overwrite=True to delete it and start empty.')
      self._replacing(existing, self._start_empty)
    return self._replay_buffer, self._observers[0]

  @contextlib.contextmanager
  def _locked_start(self):
    """Takes the buffer directory's lock and recovers interrupted saves; the
    lock is released again if the start fails."""
    self._dir_lock.acquire()
    try:
      self._store.recover()
      yield
    except BaseException:
      self._dir_lock.release()
      raise

  def _start_empty(self) -> None:
    self._start(fallback=None)
    sizes = self._sizes()
    if any(sizes.values()):
      raise errors.CheckpointCorruptError(
          f'the new server in {self._store.root} is not empty ({sizes}); '
          'something restored data into it.')

  def _require_local(self, method: str) -> None:
    if self._server_address is not None:
      raise errors.ManagerStateError(
          f'{method}() starts a local server; this manager is a client of '
          f'{self._server_address} (the server creates, loads and '
          'checkpoints the buffer): call connect().')

  def _check_port(self) -> None:
    # Checked before anything moves, so a busy port is never mistaken for a
    # checkpoint Reverb could not restore.
    if self._port is not None and not portpicker.is_port_free(self._port):
      raise ValueError(f'port {self._port} is already in use; pass another '
                       'port or port=None to pick a free one.')

  def _replacing(self, existing, start) -> None:
    """Runs `start()`; old data in the way is set aside until it succeeds."""
    moves = self._store.set_aside() if existing else []
    try:
      start()
    except BaseException:
      self._stop_server()
      self._store.restore_set_aside(moves)
      raise
    self._store.discard_set_aside(moves)

  def load_replay_buffer(self, source: Optional[str] = None, *,
                         overwrite: bool = False
                         ) -> Tuple[reverb_replay_buffer.ReverbReplayBuffer,
                                    observer_lib.TrajectoryObserver]:
    """Starts a server restored from a checkpoint, or fails loudly.

    The checkpoint's manifest is compared with this manager's configuration
    before any server starts; the newest checkpoint that verifies is used, and
    a damaged newest checkpoint falls back to the previous one with a warning.
    Loading from another buffer (e.g. a starter buffer) reads it and never
    writes there: new checkpoints go to this manager's `checkpoint_dir`.

    Args:
      source: None to resume this manager's `checkpoint_dir`; or another
        buffer directory, or one specific `ckpt-N` folder, to start from.
      overwrite: when `source` is another buffer, replace the checkpoints
        already in `checkpoint_dir` (deleted only once the load succeeded).

    Returns:
      `(replay_buffer, observer)` as in `create_replay_buffer`.

    Raises:
      CheckpointNotFoundError: if there is no checkpoint at `source`.
      ManifestMismatchError: if the checkpoint was written with another spec,
        sequence length, capacity or table config; lists every difference.
      CheckpointCorruptError: if no checkpoint at `source` is usable.
      CheckpointExistsError: if loading another buffer into a non-empty
        `checkpoint_dir` without `overwrite`.
      ManagerStateError: if the manager is already started or closed.
      ValueError: if the configured `port` is in use.
      WaitTimeoutError: if the server does not answer in time.
      BufferInUseError: if another manager (this process or another) has
        `checkpoint_dir` open; names its pid, host and start time.
    """
    self._require_local('load_replay_buffer')
    self._require_state(started=False)
    self._check_port()
    source = os.path.abspath(source) if source else self._store.root
    inside = os.path.commonpath([source, self._store.root]) == self._store.root
    with self._locked_start():
      candidates = checkpoints_lib.find_checkpoints(source)
      existing = [] if inside else self._store.existing_data()
      if existing and not overwrite:
        raise errors.CheckpointExistsError(
            f'{self._store.root} already holds checkpoints ({existing[-1]}); '
            f'loading {source} into it would mix two buffers. Call '
            'load_replay_buffer() without a source to continue this buffer, '
            'or pass overwrite=True to replace it.')
      self._replacing(existing,
                      lambda: self._start_from_newest_usable(source,
                                                             candidates))
    return self._replay_buffer, self._observers[0]

  def _start_from_newest_usable(self, source: str, candidates) -> None:
    """Starts from the first of `candidates` that loads; warns about the
    newer ones that did not."""
    problems = []
    for path in candidates:
      try:
        self._start_from(path)
      except errors.CheckpointCorruptError as e:
        problems.append(str(e))
        logging.warning('%s', e)
        continue
      if problems:
        logging.warning('Loaded %s because newer checkpoints are unusable: '
                        '%s', path, ' | '.join(problems))
      return
    raise errors.CheckpointCorruptError(
        f'no usable checkpoint in {source}: ' + ' | '.join(problems))

  def _start_from(self, path: str) -> None:
    """Verifies `path`, compares its manifest, starts and checks the server."""
    manifest = checkpoints_lib.verify(path)
    diffs = manifest_lib.diff_config(manifest, self._config)
    version_diffs = manifest_lib.diff_versions(manifest.get('versions', {}))
    if version_diffs and self._allow_version_mismatch:
      logging.warning('Loading %s written with other package versions:\n%s',
                      path, manifest_lib.format_differences(
                          version_diffs, 'checkpoint', 'installed'))
    elif version_diffs:
      diffs += version_diffs
    if diffs:
      raise errors.ManifestMismatchError(
          f'checkpoint {path} was written with a different configuration '
          f'({len(diffs)} difference(s)):\n'
          + manifest_lib.format_differences(diffs)
          + '\nPass the checkpoint\'s values to ReplayBufferManager (for '
          'versions: install them, or pass allow_version_mismatch=True), or '
          'create a new buffer.', diffs)
    try:
      self._start(fallback=path)
    except (RuntimeError, ValueError) as e:
      if isinstance(e, errors.SmartReplayError):
        raise
      raise errors.CheckpointCorruptError(
          f'Reverb could not restore {path}: {e}') from e
    try:
      self._check_restored(path, manifest)
    except BaseException:
      self._stop_server()
      raise
    self._steps_offset = manifest['counts']['env_steps']
    self._episodes_offset = manifest['counts']['episodes']
    for name, variable in self._max_priority.items():
      variable.assign(manifest['counts']['tables'][name].get('max_priority',
                                                             1.0))
    self._loaded_manifest = manifest
    self._loaded_checkpoint = path
    logging.info('Loaded replay buffer from %s: %s items, %d env steps.', path,
                 {n: c['items'] for n, c in manifest['counts']['tables'].items()},
                 self._steps_offset)

  def _check_restored(self, path: str, manifest: Dict[str, Any]) -> None:
    """Checks that the new server holds the items the manifest records.

    Remote clients (actors of a served buffer) may write the moment the
    restored server listens; the check then allows for what the tables'
    rate-limiter counters show happened since the restore.

    Raises:
      CheckpointCorruptError: if the restored items do not add up.
    """
    stats = self._table_stats()
    restored = {name: t['items'] for name, t in stats.items()}
    expected = {name: c['items']
                for name, c in manifest['counts']['tables'].items()}
    if restored == expected:
      return
    stored = checkpoint_files.read_table_counters(path)
    explained = True
    for name, want in expected.items():
      if restored.get(name) == want:
        continue
      counters = stored.get(name, {'inserts': 0, 'samples': 0})
      inserted = stats[name]['inserts'] - counters['inserts']
      sampled = stats[name]['samples'] - counters['samples']
      # An insert adds an item (evicting one when full); a sample may remove
      # one.
      explained = explained and bool(inserted or sampled) and (
          want - sampled <= restored[name] <= want + inserted)
    if not explained:
      raise errors.CheckpointCorruptError(
          f'checkpoint {path} restored {restored} items, but its manifest '
          f'records {expected}.')
    logging.info('Clients wrote to the restored server while it was checked '
                 '(%s items now, %s in %s).', restored, expected, path)

  def _start(self, fallback: Optional[str]) -> None:
    def make_tables():
      return [tables_lib.make_table(c, self._data_spec)
              for c in self._table_configs]
    root = self._store.prepare_reverb_root()
    self._server, self._client = server_lib.start_local_server(
        make_tables, checkpoint_root=root, fallback_checkpoint=fallback,
        port=self._port, connect_timeout_s=self._connect_timeout_s)
    try:
      info = server_lib.server_info(self._client, self._connect_timeout_s)
      diffs = tables_lib.server_differences(self._table_configs,
                                            self._data_spec, info)
      if diffs:
        raise errors.ManifestMismatchError(
            'the Reverb server does not serve the requested tables (a restored '
            'checkpoint overrode them):\n'
            + manifest_lib.format_differences(diffs, 'running', 'requested'),
            diffs)
      self._serve_clients(local_server=self._server)
    except BaseException:
      self._stop_server()
      raise

  def connect(self) -> Tuple[reverb_replay_buffer.ReverbReplayBuffer,
                             observer_lib.TrajectoryObserver]:
    """Client mode: connects to the standalone server at `server_address`.

    The buffer's configuration (capacity, lengths, table configs) is read
    from the server's control service; the local `data_spec`, and any of
    capacity / sequence_length / stride_length / table_configs passed to the
    constructor, must match it, and the server's Reverb tables must have the
    signatures the local spec gives.

    Returns:
      `(replay_buffer, observer)` as in `create_replay_buffer`; the observer
      writes over the network and survives a server restart (see
      `reconnect_timeout_s`).

    Raises:
      ServerUnavailableError: if the server or its control service does not
        answer within `connect_timeout_s`; names the address.
      ManifestMismatchError: if the server's spec or tables differ from the
        local ones; lists every difference (server value, local value).
      ManagerStateError: if not in client mode, or already started or closed.
      RuntimeError: if the server's control service fails otherwise.
    """
    self._require_state(started=False)
    if self._server_address is None:
      raise errors.ManagerStateError(
          'connect() is for client mode (ReplayBufferManager(..., '
          "server_address='host:port')); this manager owns its server: call "
          'create_replay_buffer() or load_replay_buffer().')
    client = reverb.Client(self._server_address)
    try:
      info = server_lib.server_info(client, self._connect_timeout_s)
    except errors.WaitTimeoutError as e:
      raise errors.ServerUnavailableError(
          f'no Reverb server answered at {self._server_address} within '
          f'{self._connect_timeout_s:g} s (connect_timeout_s). Is '
          'smart-replay-serve running there, and is the port reachable from '
          'this machine (firewall, tunnel)?') from e
    control = control_lib.ControlClient(self._control_address)
    try:
      served = control.call('info', timeout_s=self._connect_timeout_s)
      self._adopt_served_config(served['config'])
      diffs = tables_lib.server_differences(self._table_configs,
                                            self._data_spec, info)
      if diffs:
        raise errors.ManifestMismatchError(
            f'the Reverb tables at {self._server_address} differ from the '
            f'local spec ({len(diffs)} difference(s)):\n'
            + manifest_lib.format_differences(diffs, 'server', 'local'), diffs)
      self._client, self._control, self._served = client, control, served
      self._serve_clients(server_address=self._server_address)
    except BaseException:
      self._stop_server()
      control.close()
      self._forget_config()
      self._served = self._tf_client = None
      raise
    logging.info('Connected to the replay buffer served at %s (tables %s, '
                 'checkpoints in %s on the server).', self._server_address,
                 [c.name for c in self._table_configs],
                 served['checkpoint_dir'])
    return self._replay_buffer, self._observers[0]

  def _serve_clients(self, **server) -> None:
    """Makes the replay buffer, TF client and first observer of a started
    buffer; `server` is `local_server=` or `server_address=`."""
    first = self._table_configs[0]
    self._replay_buffer = reverb_replay_buffer.ReverbReplayBuffer(
        self._data_spec, table_name=first.name,
        sequence_length=(first.sequence_length if first.kind == 'sequence'
                         else None),
        rate_limiter_timeout_ms=int(self._sample_timeout_s * 1000), **server)
    # The original tool's save call, replay_buffer.py_client.checkpoint(),
    # writes a verified checkpoint through this manager.
    managed_client.install(self._replay_buffer,
                           checkpoint=lambda: self.checkpoint())
    self._tf_client = reverb.TFClient(self._client.server_address)
    self._serving.assign(True)
    self.make_observer(num_envs=self._num_envs)

  def _adopt_served_config(self, config: Dict[str, Any]) -> None:
    """Takes the server's buffer config; raises if the local one differs."""
    served = _config_kwargs(config)
    requested = {k: v for k, v in self._requested.items() if v is not None}
    self._configure(**{k: requested.get(k, served[k]) for k in
                       ('capacity', 'sequence_length', 'stride_length',
                        'table_configs')})
    diffs = manifest_lib.diff_config(config, self._config)
    if diffs:
      raise errors.ManifestMismatchError(
          f'the buffer served at {self._server_address} has another '
          f'configuration than this client ({len(diffs)} difference(s)):\n'
          + manifest_lib.format_differences(diffs, 'server', 'local')
          + '\nBuild the client from the same collect_data_spec as the '
          'server, and pass no capacity/sequence_length/stride_length/'
          'table_configs (they are read from the server) or the same ones.',
          diffs)

  # ------------------------------------------------------------------ writing

  def make_observer(self, *, priority: Optional[float] = None,
                    num_envs: Optional[int] = None
                    ) -> observer_lib.TrajectoryObserver:
    """Creates another observer on this buffer (e.g. one per actor thread).

    Args:
      priority: initial priority of every item it writes; None uses each
        table's `initial_priority`, or for prioritized tables without one the
        largest priority given so far by `update_priorities` (1.0 at first).
      num_envs: None for unbatched steps; N for batches of N environments'
        steps (one stream, with its own episodes, per environment).

    Returns:
      A `TrajectoryObserver` writing to every table; the manager flushes and
      closes it with the buffer.

    Raises:
      ManagerStateError: if the manager is not started.
      ValueError: if `priority` or `num_envs` is invalid.
    """
    self._require_state(started=True)
    obs = observer_lib.TrajectoryObserver(
        self._client, tables=self._table_configs, data_spec=self._data_spec,
        num_envs=num_envs, priority=priority,
        priority_fn=self._new_item_priority, timeout_s=self._write_timeout_s,
        chunk_length=self._chunk_length, lock=self._lock,
        reconnect_timeout_s=self._reconnect_timeout_s,
        on_reconnect=self._count_restart_loss if self._control else None,
        **self._value_policies)
    self._observers.append(obs)
    return obs

  def _count_restart_loss(self, observer: observer_lib.TrajectoryObserver
                          ) -> None:
    """Client mode, after an observer reconnected: if the server is a new
    instance (it was restarted), every observer counts the items it had
    confirmed that the restart lost."""
    del observer  # Every observer of this manager talked to the old server.
    try:
      instance = self._ask_instance()
    except errors.SmartReplayError as e:
      logging.warning('Could not ask the server at %s whether it restarted '
                      '(%s); items a restart lost are not counted.',
                      self._server_address, e)
      return
    with self._lock:
      if instance.get('id') == self._served.get('instance', {}).get('id'):
        return  # The same server: the connection was interrupted only.
      self._served['instance'] = instance
      for obs in self._observers:
        obs.count_restart_loss(instance.get('restored_save_started'))

  def _ask_instance(self) -> Dict[str, Any]:
    """The server's instance (see `ReplayServer`), on a new control channel:
    the old one may still be backing off from the server that died.

    Raises:
      ServerUnavailableError: if no answer came within 3 x
        `connect_timeout_s`.
    """
    deadline = time.monotonic() + 3 * self._connect_timeout_s
    while True:
      control = control_lib.ControlClient(self._control_address)
      try:
        return control.call('info', timeout_s=self._connect_timeout_s).get(
            'instance') or {}
      except errors.ServerUnavailableError:
        if time.monotonic() > deadline:
          raise
      finally:
        control.close()
      time.sleep(0.5)

  def _new_item_priority(self, table_name: str) -> float:
    variable = self._max_priority.get(table_name)
    return 1.0 if variable is None else float(variable.numpy())

  # ----------------------------------------------------------------- sampling

  def get_dataset(self, batch_size: int, num_steps: Optional[int] = None, *,
                  table_name: Optional[str] = None,
                  sample_timeout_s: Optional[float] = None,
                  train_step: Optional[tf.Variable] = None,
                  as_train_kwargs: bool = False,
                  prefetch: int = 2) -> tf.data.Dataset:
    """Returns a `tf.data.Dataset` of batches for `tf_agents.train.Learner`.

    Args:
      batch_size: items per batch.
      num_steps: steps per sample; a divisor of the table's sequence length
        (default: the whole item). Episode items are always sampled whole.
      table_name: the table to sample; default the first table.
      sample_timeout_s: overrides the manager's `sample_timeout_s`.
      train_step: the train-step variable (e.g. `train_utils.create_train_step()`)
        that anneals the importance-sampling beta of a prioritized table
        with `importance_beta_final`; required there, ignored elsewhere.
      as_train_kwargs: yield `(dict(experience=trajectory, weights=w), info)`
        for `Learner(use_kwargs_in_agent_train=True,
        run_optimizer_variable_init=False)`, so the agent's loss is weighted
        by the importance-sampling weights (TF-Agents 0.19 cannot pre-create
        optimizer variables from such a dataset).
      prefetch: batches to prefetch.

    Returns:
      A dataset of `(Trajectory[batch, num_steps, ...], ReplayInfo)`; the
      `ReplayInfo` holds the item keys, Reverb's sample info, the
      importance-sampling `weight` (1 unless the table is prioritized) and
      the `mask` of episode padding, each `[batch, num_steps]`. When no sample
      is allowed within the timeout, its iterator raises a `tf.errors.OpError`
      naming the table and its state, and the same iterator samples again on
      the next call. For tables with `max_times_sampled` the last batch
      before a timeout may be smaller than `batch_size` (no sampled item is
      dropped, and the Reverb prefetch depth is one batch).

    Raises:
      ValueError: if an argument is invalid or the table is unknown.
      ManagerStateError: if the manager is not started.
    """
    self._require_state(started=True)
    config = self._table_config(table_name)
    timeout = self._sample_timeout_s if sample_timeout_s is None else \
        sample_timeout_s
    _positive('sample_timeout_s', timeout)
    ordered = config.sampler in ('fifo', 'lifo')
    consumed = config.max_times_sampled > 0  # Sampling deletes items.
    return dataset_lib.make_dataset(
        self._client, table=config.name, data_spec=self._data_spec,
        sequence_length=config.item_length, batch_size=batch_size,
        num_steps=num_steps, variable_length=config.kind == 'episode',
        beta=self._beta(config, train_step), as_train_kwargs=as_train_kwargs,
        timeout_s=timeout,
        max_in_flight_samples_per_worker=batch_size if consumed else None,
        num_workers_per_iterator=1 if ordered or consumed else 2,
        drop_remainder=not consumed, prefetch=prefetch)

  @staticmethod
  def _beta(config: tables_lib.TableConfig, train_step: Optional[tf.Variable]
            ) -> Optional[Callable[[], Any]]:
    """The importance-sampling beta of `config`, as the dataset reads it."""
    if not config.prioritized:
      return None
    start = config.importance_beta
    if config.importance_beta_final is None:
      return lambda: start
    if not isinstance(train_step, tf.Variable):
      raise ValueError(
          f'table {config.name!r} anneals importance_beta from {start} to '
          f'{config.importance_beta_final} over '
          f'{config.importance_beta_steps} train steps; pass the train step '
          f'variable as get_dataset(train_step=...), got {train_step!r}.')
    final, steps = config.importance_beta_final, config.importance_beta_steps
    def beta():
      progress = tf.minimum(tf.constant(1.0, tf.float64),
                            tf.cast(train_step, tf.float64) / steps)
      return start + (final - start) * progress
    return beta

  def _table_config(self, table_name: Optional[str]) -> tables_lib.TableConfig:
    if table_name is None:
      return self._table_configs[0]
    for config in self._table_configs:
      if config.name == table_name:
        return config
    raise ValueError(f'unknown table_name {table_name!r}; this buffer has '
                     f'tables {[c.name for c in self._table_configs]}.')

  def check_prefill(self, steps: int, *, num_envs: Optional[int] = None
                    ) -> None:
    """Checks that `steps` more env steps can be written with nothing sampling.

    A `samples_per_insert` (or queue) rate limiter blocks inserts once the
    table is ahead of the sampler by its error buffer, so a starter buffer
    written before any learner runs would wait forever in plain Reverb. Call
    this before such a prefill; it counts, per table, the most items
    `steps` steps can make (sequence tables: one per `min(stride, length)`
    steps; episode tables: one per step at worst) and compares them with what
    the limiter still allows with nothing sampling. Before the buffer is started it assumes an
    empty buffer (check before `create_replay_buffer(overwrite=True)` so a
    bad config never replaces data).

    Args:
      steps: env steps about to be written (over all environments).
      num_envs: environments writing them; default the manager's `num_envs`.

    Raises:
      PrefillWouldBlockError: naming each table that would block, how many
        items it would take and how to fix the config.
      ManagerStateError: if the manager is closed (or, in client mode, not
        connected).
    """
    _positive('steps', steps, integer=True)
    self._require_state(started=self._server_address is not None or None)
    counts = dict.fromkeys((c.name for c in self._table_configs),
                           {'inserts': 0, 'samples': 0, 'items': 0})
    if self._client is not None:
      counts = self._table_stats()
    streams = num_envs or self._num_envs or 1
    problems = []
    for config in self._table_configs:
      count = counts[config.name]
      items = _max_items(config, steps, streams)
      allowed = config.inserts_before_blocking(
          inserts=count['inserts'], samples=count['samples'],
          size=count['items'])
      if items <= allowed:
        continue
      if config.block_inserts_when_full:
        fix = ('use block_inserts_when_full=False for a buffer filled before '
               f'training, or max_size >= {count["items"] + items}')
      else:
        # Inserts go through while inserts <= min_size + error_buffer / spi.
        total = count['inserts'] + items
        spi = config.samples_per_insert
        fix = ('raise error_buffer to >= '
               f'{spi * (total - config.min_size_to_sample):g}')
        min_size = math.ceil(total - config.error_buffer / spi)
        if config.kind == 'sequence' and min_size <= config.max_size:
          fix += (f', or set min_size_to_sample >= {min_size} (a minimum '
                  'size that covers the prefill: the learner starts sampling '
                  'once the table holds that many items, so keep it at most '
                  'the items the prefill really makes)')
        fix += ('; train with the same table config, since a checkpoint '
                'keeps its limiter')
      problems.append(
          f'table {config.name!r}: up to {items} new items, but its '
          f'{"queue" if config.block_inserts_when_full else "samples_per_insert"}'
          f' rate limiter lets only {allowed:g} in while nothing samples; '
          f'{fix}.')
    if problems:
      raise errors.PrefillWouldBlockError(
          f'writing {steps} env steps with nothing sampling would block:\n  '
          + '\n  '.join(problems))

  # --------------------------------------------------------------- priorities

  def update_priorities(self, keys: Any, priorities: Any, *,
                        table_name: Optional[str] = None) -> None:
    """Sets the priorities of sampled items (prioritized replay).

    Works eagerly and inside a `tf.function`, e.g. a Learner's
    `after_train_strategy_step_fn` (see `priority_update_fn`). Each new
    priority is `|priority| + priority_epsilon` of the table, so TD errors can
    be passed directly and no item's priority is zero; the table's largest
    priority so far becomes the priority of new items (unless the table sets
    `initial_priority`). Keys no longer in the table are ignored.

    Args:
      keys: uint64 item keys, `[batch]`, or `[batch, num_steps]` as in
        `ReplayInfo.key` (the first column is used).
      priorities: `[batch]` new priorities (e.g. absolute TD errors).
      table_name: the table; default the first prioritized table.

    Raises:
      ValueError: if the table is unknown or not prioritized, or (eagerly)
        if the shapes differ or a priority is not finite; in a `tf.function`
        the shape and finiteness checks raise `InvalidArgumentError`.
      ManagerStateError: if the manager is not started.
    """
    self._require_state(started=True)
    config = self._prioritized_table(table_name)
    if not tf.is_tensor(keys):  # Python ints above 2**63 need uint64 first.
      keys = np.asarray(keys, np.uint64)
    keys = tf.convert_to_tensor(keys)
    if keys.shape.rank == 2:
      keys = keys[:, 0]
    keys = tf.cast(keys, tf.uint64)
    priorities = tf.cast(tf.convert_to_tensor(priorities), tf.float64)
    if keys.shape.rank != 1 or priorities.shape.rank != 1:
      raise ValueError(
          f'update_priorities: keys must have shape [batch] or [batch, steps] '
          f'and priorities [batch]; got keys {keys.shape}, priorities '
          f'{priorities.shape} (table {config.name!r}).')
    if tf.executing_eagerly():
      values = priorities.numpy()
      if len(values) != int(tf.size(keys)):
        raise ValueError(
            f'update_priorities: {int(tf.size(keys))} keys but {len(values)} '
            f'priorities (table {config.name!r}).')
      bad = np.flatnonzero(~np.isfinite(values))
      if bad.size:
        raise ValueError(
            f'update_priorities: priorities[{bad[0]}] = {values[bad[0]]!r} is '
            f'not finite ({bad.size} such values; table {config.name!r}); a '
            'diverging loss gives NaN TD errors.')
    checks = [
        tf.debugging.Assert(self._serving, [
            f'update_priorities: the buffer {self._where} is closed '
            f'(table {config.name!r})']),
        tf.debugging.assert_equal(
            tf.size(keys), tf.size(priorities),
            message=f'update_priorities: keys and priorities differ in length '
            f'(table {config.name!r})'),
        tf.debugging.assert_all_finite(
            priorities, f'update_priorities: a priority is not finite (table '
            f'{config.name!r})')]
    with tf.control_dependencies(checks):
      priorities = tf.abs(priorities) + config.priority_epsilon
    largest = self._max_priority[config.name]
    largest.assign(tf.maximum(largest, tf.reduce_max(
        tf.concat([priorities, tf.zeros([1], tf.float64)], 0))))
    self._tf_client.update_priorities(config.name, keys, priorities)

  def priority_update_fn(self, *, table_name: Optional[str] = None,
                         priorities_fn: Optional[Callable[[Any], Any]] = None
                         ) -> Callable[[Any, Any], None]:
    """Returns a Learner `after_train_strategy_step_fn` updating priorities.

    Args:
      table_name: the prioritized table; default the first one.
      priorities_fn: maps the agent's `LossInfo` to `[batch]` priorities;
        default `loss_info.extra.td_error` (DQN agents).

    Returns:
      `fn(experience, loss_info)`, where `experience` is the
      `(experience, ReplayInfo)` pair the Learner sampled, for
      `tf_agents.train.Learner(after_train_strategy_step_fn=...)` (with or
      without `use_kwargs_in_agent_train`).

    Raises:
      ValueError: if the table is unknown or not prioritized.
    """
    config = self._prioritized_table(table_name)
    priorities_fn = priorities_fn or (lambda loss: loss.extra.td_error)
    # Named as the Learner passes them with use_kwargs_in_agent_train=True.
    def update(experience, loss_info):
      _, info = experience  # (experience, ReplayInfo)
      self.update_priorities(info.key, priorities_fn(loss_info),
                             table_name=config.name)
    return update

  def _prioritized_table(self, table_name: Optional[str]
                         ) -> tables_lib.TableConfig:
    if self._config is None:  # Client mode before connect().
      self._require_state(started=True)
    if table_name is None:
      found = [c for c in self._table_configs if c.prioritized]
      if not found:
        raise ValueError(
            'this buffer has no prioritized table (tables '
            f'{[(c.name, c.sampler) for c in self._table_configs]}); add a '
            "TableConfig(sampler='prioritized').")
      return found[0]
    config = self._table_config(table_name)
    if not config.prioritized:
      raise ValueError(f'table {config.name!r} samples {config.sampler!r}, '
                       "not 'prioritized': priorities would not change what "
                       'is sampled.')
    return config

  # ------------------------------------------------------------ checkpointing

  def checkpoint(self, *, extra: Optional[Dict[str, Any]] = None) -> str:
    """Flushes the observers and writes a verified checkpoint.

    Writing through this manager's observers pauses while the checkpoint is
    taken, so the manifest's counts describe exactly what was saved (items are
    recounted from the files when something else changed the table meanwhile).
    In client mode the server writes the checkpoint, into its own directory,
    after this client's observers are flushed; the path is on the server's
    machine.

    Args:
      extra: JSON-serializable metadata stored in the manifest (e.g.
        `{'train_step': 1000}`).

    Returns:
      The checkpoint folder, `checkpoint_dir/checkpoints/ckpt-N`.

    Raises:
      ValueError: if `extra` is not JSON-serializable (names the key).
      WaitTimeoutError: if flushing or writing takes longer than the timeouts,
        or an earlier timed-out save is still being written.
      CheckpointWriteError: if the save failed (disk full, read-only or failing
        disk, Reverb's write); names the path and the cause. Nothing of it is
        left, earlier checkpoints are intact and the buffer keeps serving.
      CheckpointCorruptError: if Reverb's output is missing or incomplete.
      ManagerStateError: if the manager is not started.
      ServerUnavailableError: in client mode, if the server does not answer
        within the deadline (3 x checkpoint_timeout_s).
    """
    for key, value in (extra or {}).items():
      try:
        json.dumps(value)
      except (TypeError, ValueError) as e:
        raise ValueError(
            f'checkpoint(extra=...): extra[{key!r}] = {value!r} '
            f'({type(value).__name__}) is not JSON-serializable ({e}); convert '
            'it, e.g. int(train_step.numpy()).') from None
    with self._lock:
      self._require_state(started=True)
      if self._control is not None:
        self.flush()
        # The server may first wait for its own save in progress.
        path = self._control.call('checkpoint', {'extra': extra},
                                  timeout_s=3 * self._checkpoint_timeout_s)
        logging.info('The server at %s checkpointed to %s',
                     self._server_address, path)
        return path
      self._wait_for_pending_save()
      self.flush()
      self._tidy_reverb_root()
      env_steps, episodes = self._env_steps(), self._episodes()
      save_started = time.time()
      reverb_path, before, table_stats = self._reverb_checkpoint()
      for name, variable in self._max_priority.items():
        table_stats[name]['max_priority'] = float(variable.numpy())
        before[name]['max_priority'] = table_stats[name]['max_priority']
      if table_stats != before:
        # Another client wrote or sampled meanwhile: count what was saved.
        stored = checkpoint_files.count_items(reverb_path)
        for name, stats in table_stats.items():
          stats['items'] = stored.get(name, 0)
      # save_started_unix: clients that confirmed items after it and then
      # see a server restored from this checkpoint count them as lost.
      counts = {'tables': table_stats, 'env_steps': env_steps,
                'episodes': episodes, 'save_started_unix': save_started}
      path = self._store.commit(
          reverb_path, lambda name, files: manifest_lib.build_manifest(
              self._config, counts=counts, files=files, checkpoint_name=name,
              extra=extra))
    logging.info('Checkpointed %s items, %d env steps to %s',
                 {n: s['items'] for n, s in table_stats.items()}, env_steps,
                 path)
    return path

  def _reverb_checkpoint(self) -> Tuple[str, Dict[str, Dict[str, int]],
                                        Dict[str, Dict[str, int]]]:
    """Has Reverb write its tables to `.reverb/`, bounded by the timeout.

    Returns:
      `(folder, stats_before, stats_after)`: the folder Reverb wrote, and
      `_table_stats()` just before and after the save.

    Raises:
      WaitTimeoutError: if Reverb takes longer than `checkpoint_timeout_s`
        (the save continues; the next save or `close()` waits for it).
      CheckpointWriteError: if Reverb failed to write, or wrote an
        incomplete folder (its leftovers are removed).
    """
    before = self._table_stats()
    save = self._save_pool.submit(self._client.checkpoint)
    try:
      path = server_lib.wait_for_checkpoint(
          save, timeout_s=self._checkpoint_timeout_s,
          where=self._store.reverb_root)
    except errors.WaitTimeoutError:
      self._pending_save = save
      raise
    except errors.CheckpointWriteError:
      self._tidy_reverb_root()  # Remove what the failed write left.
      raise
    after = self._table_stats()
    problems = checkpoint_files.written_problems(
        path, {name: t['items'] if after[name]['items'] == t['items'] else None
               for name, t in before.items()})
    if problems:
      shutil.rmtree(path, ignore_errors=True)
      free = shutil.disk_usage(self._store.root).free
      raise errors.CheckpointWriteError(
          f'Reverb reported checkpoint {path} as written, but it is '
          f"incomplete ({'; '.join(problems)}); it was removed. Reverb "
          f'ignores some write errors: its disk has {free:,} bytes free.')
    return path, before, after

  def _tidy_reverb_root(self) -> None:
    """Recovers leftovers of interrupted saves (see `CheckpointStore.recover`);
    a failure here is logged: Reverb's next save prunes its root anyway."""
    try:
      self._store.recover()
    except OSError as e:
      logging.warning('Could not tidy %s: %s', self._store.reverb_root, e)

  def _wait_for_pending_save(self) -> None:
    """Waits (bounded) for a save that timed out earlier to finish."""
    if self._pending_save is None:
      return
    try:
      self._pending_save.result(timeout=self._checkpoint_timeout_s)
    except concurrent.futures.TimeoutError as e:
      raise errors.WaitTimeoutError(
          'an earlier checkpoint is still being written to '
          f'{self._store.reverb_root} after another '
          f'{self._checkpoint_timeout_s:g} s.') from e
    except RuntimeError as e:
      logging.warning('An earlier timed-out checkpoint failed: %s', e)
    # Its folder (if any) was never committed; Reverb prunes it on the next
    # save, or the next start moves it to orphaned/.
    self._pending_save = None

  # ------------------------------------------------------------------- counts

  def _sizes(self) -> Dict[str, int]:
    return {name: stats['items'] for name, stats in self._table_stats().items()}

  def _env_steps(self) -> int:
    return self._steps_offset + sum(o.num_steps for o in self._observers)

  def _episodes(self) -> int:
    return self._episodes_offset + sum(o.num_episodes for o in self._observers)

  def num_frames(self) -> int:
    """Returns the number of items in the first table (the seed's meaning).

    It counts what the server holds: an observer sends a stream's items when
    their chunk (`chunk_length` steps) is complete, at each episode end and
    on `flush()`, so call `flush()` first for a count that includes the
    steps just written.

    Raises:
      ManagerStateError: if the manager is not started.
      WaitTimeoutError: if the server does not answer in time.
    """
    self._require_state(started=True)
    return self._sizes()[self._table_configs[0].name]

  def _table_stats(self, info=None) -> Dict[str, Dict[str, int]]:
    info = info or server_lib.server_info(self._client, self._connect_timeout_s)
    tables = {}
    for config in self._table_configs:
      t = info[config.name]
      tables[config.name] = {
          'items': t.current_size,
          'max_size': t.max_size,
          'inserts': t.rate_limiter_info.insert_stats.completed,
          'samples': t.rate_limiter_info.sample_stats.completed,
          'episodes': t.num_episodes,
          'unique_samples': t.num_unique_samples,
      }
    return tables

  def stats(self, *, times_sampled: bool = False) -> Dict[str, Any]:
    """Returns what the buffer holds and has done, per table and in total.

    Args:
      times_sampled: also list how many times each item was sampled. This
        takes an exact snapshot of the tables (Reverb writes them to disk, as
        for a checkpoint, in `checkpoint_dir/.reverb/`, deleted afterwards;
        in client mode the server does it), so it costs about as much as
        `checkpoint()`.

    Returns:
      A dict::

        {'tables': {name: {
             'kind', 'items', 'max_size', 'inserts', 'samples', 'episodes',
             'unique_samples',
             'mean_times_sampled',   # samples / inserts
             'rate_limiter': {'type', 'can_insert', 'can_sample',
                              'inserts_before_blocking',
                              'insert_blocked_for_s', 'sample_blocked_for_s',
                              'insert_wait_total_s', 'sample_wait_total_s'},
             'max_priority',         # prioritized tables
             'long_episodes', 'dropped_episodes',  # episode tables
             'times_sampled',        # {key: n}, if asked
             'times_sampled_histogram'}},  # {n: items}, if asked
         'env_steps', 'episodes', 'short_episodes', 'short_episode_steps',
         'lost_steps', 'lost_items', 'lost_at_restart', 'reconnects'}

      `items` is what the server holds (call `flush()` first to include
      items still in an observer's open chunk; `stats()` itself never waits
      on a blocked table). `inserts`/`samples` are the rate limiter's
      counters (Reverb counts samples prefetched by a dataset); `episodes` per table is Reverb's
      count, which includes the episode in progress. `*_blocked_for_s` is
      how long inserting / sampling has been blocked, measured from the first
      `stats()` call that saw it blocked (0 when not blocked);
      `*_wait_total_s` is Reverb's total. `env_steps` / `episodes` count the
      steps and finished episodes written through this buffer's observers
      (carried over from the loaded checkpoint; in client mode, this
      process's observers only); `lost_steps` / `lost_items` count what
      observers could not store because the server stayed unreachable longer
      than `reconnect_timeout_s`, and `lost_items` also the confirmed items a
      restart of the server lost (`lost_at_restart`: confirmed after the
      restored checkpoint's save began); `short_episodes` counts
      episodes of this session shorter than the shortest sequence item
      (their steps are in `short_episode_steps`).

    Raises:
      ManagerStateError: if the manager is not started.
      WaitTimeoutError: if the server does not answer in time.
    """
    self._require_state(started=True)
    info = server_lib.server_info(self._client, self._connect_timeout_s)
    tables = self._table_stats(info)
    now = time.monotonic()
    for config in self._table_configs:
      stats = tables[config.name]
      stats['kind'] = config.kind
      stats['mean_times_sampled'] = (stats['samples'] / stats['inserts']
                                     if stats['inserts'] else 0.0)
      limiter = tables_lib.limiter_state(config, info[config.name])
      for action in ('insert', 'sample'):
        since_key = (config.name, action)
        if limiter[f'can_{action}']:
          self._blocked_since.pop(since_key, None)
        else:
          self._blocked_since.setdefault(since_key, now)
        limiter[f'{action}_blocked_for_s'] = now - self._blocked_since.get(
            since_key, now)
      stats['rate_limiter'] = limiter
      if config.prioritized:
        stats['max_priority'] = self._new_item_priority(config.name)
      if config.kind == 'episode':
        stats['long_episodes'] = sum(o.num_long_episodes[config.name]
                                     for o in self._observers)
        stats['dropped_episodes'] = sum(o.num_dropped_episodes[config.name]
                                        for o in self._observers)
    if times_sampled:
      counts = {name: {} for name in tables}
      if self._control is not None:
        served = self._control.call('times_sampled',
                                    timeout_s=self._checkpoint_timeout_s)
        for name, per_item in served.items():
          counts[name] = {int(key): n for key, n in per_item.items()}
      else:
        for item in self._snapshot(checkpoint_files.read_items, flush=False):
          counts[item.table][item.key] = item.times_sampled
      for name, per_item in counts.items():
        tables[name]['times_sampled'] = per_item
        tables[name]['times_sampled_histogram'] = dict(sorted(
            collections.Counter(per_item.values()).items()))
    return {'tables': tables, 'env_steps': self._env_steps(),
            'episodes': self._episodes(),
            'short_episodes': sum(o.num_short_episodes for o in self._observers),
            'short_episode_steps': sum(o.num_short_episode_steps
                                       for o in self._observers),
            'lost_steps': sum(o.num_lost_steps for o in self._observers),
            'lost_items': sum(o.num_lost_items for o in self._observers),
            'lost_at_restart': sum(o.num_lost_at_restart
                                   for o in self._observers),
            'reconnects': sum(o.num_reconnects for o in self._observers)}

  # ------------------------------------------------------------------ epochs

  def num_batches(self, batch_size: int, *, table_name: Optional[str] = None,
                  drop_remainder: bool = False) -> int:
    """Returns how many batches one `epoch()` of the table yields now.

    Args:
      batch_size: items per batch.
      table_name: the table; default the first.
      drop_remainder: count only full batches.

    Returns:
      `ceil(items / batch_size)` (`floor` with `drop_remainder`); call
      `flush()` first to include items still in an observer's open chunk.

    Raises:
      ValueError: if `batch_size` or the table is invalid.
      ManagerStateError: if the manager is not started.
    """
    _positive('batch_size', batch_size, integer=True)
    self._require_state(started=True)
    items = self._table_stats()[self._table_config(table_name).name]['items']
    return items // batch_size if drop_remainder else -(-items // batch_size)

  def epoch(self, batch_size: int, *, table_name: Optional[str] = None,
            seed: Optional[int] = None, drop_remainder: bool = False
            ) -> Iterator[Tuple[Any, np.ndarray]]:
    """Visits every stored item of a table once, in shuffled order.

    For training in epochs (as with ObjectRL's buffers) rather than by
    sampling. When called, the observers are flushed and the table is read
    from an exact snapshot (as `stats(times_sampled=True)` takes, about the
    cost of a checkpoint; writing pauses only while Reverb writes it), so
    sampling counters and rate limiters are untouched and no item is seen
    twice or missed.

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
    _positive('batch_size', batch_size, integer=True)
    self._require_state(started=True)
    if self._store is None:
      raise errors.ManagerStateError(
          'epoch() reads an exact snapshot of the tables on the server\'s '
          'disk; run it where the buffer is served (or export the buffer '
          'with smart_replay.tools.export and read that).')
    config = self._table_config(table_name)
    items = self._snapshot(lambda path: list(
        checkpoint_reader.CheckpointReader(path).items(config.name)),
                           flush=True)
    lengths = sorted({len(item.columns[0]) for item in items})
    if len(lengths) > 1:
      raise ValueError(
          f'table {config.name!r} holds items of {len(lengths)} lengths '
          f'({lengths[0]}..{lengths[-1]} steps); an epoch stacks items of one '
          'length. Sample episodes of any length with get_dataset().')
    order = np.random.default_rng(seed).permutation(len(items))
    stop = len(items) - len(items) % batch_size if drop_remainder else len(
        items)

    def batches():
      for begin in range(0, stop, batch_size):
        batch = [items[i] for i in order[begin:begin + batch_size]]
        columns = [np.stack(field) for field in zip(
            *(item.columns for item in batch))]
        yield (checkpoint_reader.unflatten(self._data_spec, columns),
               np.array([item.key for item in batch], np.uint64))
    return batches()

  def _snapshot(self, read: Callable[[str], Any], *, flush: bool) -> Any:
    """Returns `read(path)` of a throwaway Reverb checkpoint of the tables.

    Writing through this manager pauses only while Reverb writes it.
    """
    with self._lock:
      if flush:
        self.flush()
      self._wait_for_pending_save()
      path, _, _ = self._reverb_checkpoint()
    try:
      return read(path)
    finally:
      shutil.rmtree(path, ignore_errors=True)

  # ---------------------------------------------------------------- lifecycle

  @property
  def replay_buffer(self) -> reverb_replay_buffer.ReverbReplayBuffer:
    """The TF-Agents replay buffer on the first table (None before start)."""
    return self._replay_buffer

  @property
  def observer(self) -> Optional[observer_lib.TrajectoryObserver]:
    """The observer returned by create/load (None before start)."""
    return self._observers[0] if self._observers else None

  @property
  def server_address(self) -> Optional[str]:
    """'localhost:PORT' of the running server, or the server_address of
    client mode (None before start)."""
    return self._client.server_address if self._client else None

  @property
  def checkpoint_dir(self) -> Optional[str]:
    """The absolute buffer directory (in client mode the server's, on its
    machine, once connected)."""
    if self._store is None:
      return self._served['checkpoint_dir'] if self._control else None
    return self._store.root

  @property
  def table_configs(self) -> Sequence[tables_lib.TableConfig]:
    """The resolved configs of the tables, first one the default."""
    return list(self._table_configs)

  @property
  def buffer_config(self) -> Optional[Dict[str, Any]]:
    """The buffer's configuration as a manifest stores it (spec, capacity,
    lengths, tables); in client mode, once connected."""
    return self._config

  @property
  def sequence_length(self) -> int:
    """Steps per item."""
    return self._sequence_length

  @property
  def keep_checkpoints(self) -> Optional[int]:
    """How many complete checkpoints are kept on disk (client mode: the
    server's setting, once connected)."""
    if self._store is None:
      return self._served['keep_checkpoints'] if self._control else None
    return self._store.keep

  @property
  def data_spec(self) -> Any:
    """The spec of one step this buffer stores."""
    return self._data_spec

  @property
  def loaded_manifest(self) -> Optional[Dict[str, Any]]:
    """The manifest of the checkpoint `load_replay_buffer` restored, or None.

    Its `extra` holds what was passed to `checkpoint(extra=...)`.
    """
    return self._loaded_manifest

  @property
  def loaded_checkpoint(self) -> Optional[str]:
    """The checkpoint folder `load_replay_buffer` restored, or None."""
    return self._loaded_checkpoint

  def existing_checkpoints(self) -> Sequence[str]:
    """Returns the `ckpt-N` folders in `checkpoint_dir`, oldest first.

    In client mode the server lists them (paths on its machine).

    Raises:
      ManagerStateError: in client mode, if not connected.
      ServerUnavailableError: if the server does not answer in time.
    """
    if self._store is None:
      self._require_state(started=True)
      return self._control.call('info', timeout_s=self._connect_timeout_s
                                )['checkpoints']
    return self._store.checkpoints()

  def flush(self) -> None:
    """Flushes every observer of this manager.

    Raises:
      WaitTimeoutError: if the server does not accept pending items in time.
      ServerUnavailableError, WriteFailedError: if an observer lost steps
        (see `TrajectoryObserver`).
    """
    for obs in self._observers:
      obs.flush()

  def clear(self) -> None:
    """Empties every table of the running server; checkpoints are untouched.

    In client mode this empties the shared server's tables for every client.

    Observers are flushed first and their current episode is closed, so items
    written after `clear()` hold only steps written after it. Counters in
    `stats()` restart at zero.

    Raises:
      ManagerStateError: if the manager is not started.
      WaitTimeoutError: if flushing the observers times out.
    """
    with self._lock:
      self._require_state(started=True)
      for obs in self._observers:
        obs.end_episode()
      for config in self._table_configs:
        self._client.reset(config.name)
      for obs in self._observers:
        obs.reset_counters()
      self._steps_offset = self._episodes_offset = 0
      for variable in self._max_priority.values():
        variable.assign(1.0)
      self._blocked_since.clear()

  def close(self) -> None:
    """Flushes and closes the observers, then stops the server.

    In client mode the server keeps running; only this client disconnects.

    Safe to call more than once. A checkpoint still being written (after a
    timeout) is waited for, up to `checkpoint_timeout_s`. The server is stopped
    even if a flush or that wait fails; the error is raised afterwards.

    Raises:
      WaitTimeoutError: if an observer could not flush in time, or an earlier
        checkpoint did not finish.
      ServerUnavailableError, WriteFailedError: if an observer lost steps
        (see `TrajectoryObserver`).
    """
    with self._lock:
      if self._closed:
        return
      self._closed = True
      failure = None
      for obs in self._observers:
        try:
          obs.close()
        except errors.SmartReplayError as e:
          failure = failure or e
          logging.error('Closing observer failed: %s', e)
      try:
        self._wait_for_pending_save()
      except errors.WaitTimeoutError as e:
        failure = failure or e
        logging.error('%s', e)
      self._stop_server()
      self._save_pool.shutdown(wait=False)
      if self._dir_lock is not None:
        self._dir_lock.release()
    if failure:
      raise failure

  def _stop_server(self) -> None:
    self._serving.assign(False)
    if self._server is not None:
      self._server.stop()
    if self._control is not None:
      self._control.close()
    self._server = self._client = self._replay_buffer = self._control = None
    self._observers = []

  def _require_state(self, *, started: Optional[bool]) -> None:
    """Raises unless open and (if `started` is not None) started or not."""
    if os.getpid() != self._pid:
      raise errors.ManagerStateError(
          f'this ReplayBufferManager was created in process {self._pid} and '
          f'is used in process {os.getpid()}, a forked copy: a Reverb client '
          'hangs after fork. Start worker processes with '
          "multiprocessing.get_context('spawn') and build a manager in each "
          "(client mode: server_address=...).")
    if self._closed:
      raise errors.ManagerStateError(
          f'this ReplayBufferManager ({self._where}) is closed; create a new '
          'one.')
    if started and self._client is None:
      raise errors.ManagerStateError(
          'the buffer is not started; call create_replay_buffer() or '
          'load_replay_buffer() first (connect() in client mode).')
    if started is False and self._client is not None:
      raise errors.ManagerStateError(
          f'the buffer is already started (server at {self.server_address}).')

  def __enter__(self) -> 'ReplayBufferManager':
    """Returns the manager itself; `close()` runs on leaving the block."""
    return self

  def __exit__(self, exc_type, exc_value, traceback) -> None:
    """Closes the manager; a close error never masks an error in the block."""
    if exc_type is None:
      self.close()
      return
    try:  # Do not mask the exception that is already propagating.
      self.close()
    except errors.SmartReplayError as e:
      logging.error('While handling %s, close() failed: %s', exc_type.__name__,
                    e)
