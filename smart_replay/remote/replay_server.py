"""A standalone replay buffer server for actors and learners in other processes.

`ReplayServer` runs a `ReplayBufferManager`'s Reverb server for remote clients
(`ReplayBufferManager(server_address=...)`): it creates the buffer, or resumes
its newest verified checkpoint, writes checkpoints on a schedule (every N
seconds and/or N inserted items) and on request of a client, writes a final
one when asked to stop, and logs table sizes and insert/sample rates at an
interval. Clients reach it on two ports: Reverb's (data) and the control
service's (configuration and checkpoints, `smart_replay.remote.control`).

`serve()` is what the `smart-replay-serve` binary runs.
"""

import datetime
import socket
import threading
import time
import uuid
from typing import Any, Callable, Dict, Optional

from absl import logging
import gin

from smart_replay.checkpointing import files as checkpoint_files
from smart_replay.remote import control as control_lib
from smart_replay import errors
from smart_replay import manager as manager_lib
from smart_replay.remote import serving_record
from smart_replay.core import specs

ON_EXISTING = ('resume', 'overwrite', 'refuse')

SECURITY_WARNING = (
    'SECURITY: Reverb (port {port}) and the control service (port '
    '{control_port}) listen on ALL network interfaces, with no '
    'authentication and no encryption. Anyone who can reach these ports can '
    'read, write, delete and checkpoint this buffer. Serve on one machine '
    '(clients use localhost) or on a private network, or reach it through '
    'an SSH tunnel or VPN; never expose these ports to the internet '
    '(README: "Security").')


def _saved_counts(path: str):
  """(inserts, samples) over all tables, as the checkpoint at `path` holds
  them (the live counters may already be ahead: clients write meanwhile)."""
  counters = checkpoint_files.read_table_counters(path).values()
  return (sum(c['inserts'] for c in counters),
          sum(c['samples'] for c in counters))


def _save_started(manifest: Optional[Dict[str, Any]]) -> Optional[float]:
  """When the save of a checkpoint began (wall time), or None without one;
  manifests of older versions give their creation time instead."""
  if not manifest:
    return None
  started = manifest['counts'].get('save_started_unix')
  if started is None:
    started = datetime.datetime.fromisoformat(
        manifest['created_utc']).timestamp()
  return started


@gin.configurable
class ReplayServer:
  """Serves one replay buffer to remote actors and learners.

  Use as a context manager, or call `start()` and `close()`::

      manager = ReplayBufferManager(data_spec=spec, capacity=1_000_000,
                                    checkpoint_dir='/data/buffer', port=8000)
      with ReplayServer(manager, checkpoint_every_s=600) as server:
        server.serve_until(stop_requested)   # final checkpoint on the way out

  Args:
    manager: an unstarted local `ReplayBufferManager` (with `checkpoint_dir`
      and, for remote clients, a fixed `port`).
    control_port: port of the control service; default the Reverb port + 1.
    checkpoint_every_s: write a checkpoint this many seconds after the last
      one (None: no time schedule).
    checkpoint_every_inserts: write a checkpoint once this many items were
      inserted (over all tables) since the last one (None: no insert
      schedule).
    max_unsaved_s: write a checkpoint once items inserted since the last one
      are this many seconds old, whatever the schedules say, so the tail of
      an insert-count schedule (fewer than `checkpoint_every_inserts` items)
      is saved too (None: no bound; unsaved items are lost with the
      process).
    checkpoint_retry_s: after a scheduled checkpoint failed (e.g. a full
      disk), wait this long before the next try; serving goes on meanwhile
      and the status line shows the failure.
    log_every_s: seconds between status log lines (table sizes, rates).
    on_existing: what to do when `checkpoint_dir` already holds checkpoints:
      'resume' the newest verified one (a restart after a crash), 'overwrite'
      them with an empty buffer, or 'refuse' to start.

  Raises:
    ValueError: if an argument is invalid; names it and its value.
  """

  def __init__(self, manager: manager_lib.ReplayBufferManager, *,
               control_port: Optional[int] = None,
               checkpoint_every_s: Optional[float] = None,
               checkpoint_every_inserts: Optional[int] = None,
               max_unsaved_s: Optional[float] = 300.0,
               checkpoint_retry_s: float = 30.0,
               log_every_s: float = 60.0, on_existing: str = 'resume'):
    if not isinstance(manager, manager_lib.ReplayBufferManager):
      raise ValueError(f'manager must be a ReplayBufferManager, got '
                       f'{manager!r}.')
    for name, value in (('checkpoint_every_s', checkpoint_every_s),
                        ('checkpoint_every_inserts', checkpoint_every_inserts),
                        ('max_unsaved_s', max_unsaved_s),
                        ('checkpoint_retry_s', checkpoint_retry_s),
                        ('log_every_s', log_every_s)):
      if value is not None and (isinstance(value, bool) or
                                not isinstance(value, (int, float)) or
                                value <= 0):
        raise ValueError(f'{name} must be None or a positive number, got '
                         f'{value!r}.')
    if checkpoint_every_inserts is not None and not isinstance(
        checkpoint_every_inserts, int):
      raise ValueError(f'checkpoint_every_inserts must be an integer, got '
                       f'{checkpoint_every_inserts!r}.')
    for name, value in (('log_every_s', log_every_s),
                        ('checkpoint_retry_s', checkpoint_retry_s)):
      if value is None:
        raise ValueError(f'{name} must be a positive number, got None.')
    if on_existing not in ON_EXISTING:
      raise ValueError(f'on_existing must be one of {ON_EXISTING}, got '
                       f'{on_existing!r}.')
    if control_port is not None and (isinstance(control_port, bool) or
                                     not isinstance(control_port, int) or
                                     not 0 < control_port < 65536):
      raise ValueError(f'control_port must be None or a TCP port, got '
                       f'{control_port!r}.')
    self._manager = manager
    self._control_port = control_port
    self._every_s = checkpoint_every_s
    self._every_inserts = checkpoint_every_inserts
    self._max_unsaved_s = max_unsaved_s
    self._retry_s = float(checkpoint_retry_s)
    # (monotonic time of the first, message of the latest) failure of
    # scheduled checkpoints since the last success, and when to try again.
    self._failing_since = None
    self._retry_at = 0.0
    self._log_every_s = float(log_every_s)
    self._on_existing = on_existing
    self._control = None
    self._last_checkpoint = None
    self._last_checkpoint_time = None
    self._last_checkpoint_counts = None
    # When items were first inserted after the last checkpoint (None: none).
    self._unsaved_since = None
    self._last_log = None  # (time, stats) of the previous status line.
    self._lock = threading.Lock()
    self._started = self._closed = False
    self._restart_loss = None
    self._recorded_inserts = None

  # ----------------------------------------------------------------- start-up

  def start(self) -> 'ReplayServer':
    """Creates or resumes the buffer and starts the control service.

    Returns:
      The server itself.

    Raises:
      CheckpointExistsError: if there are checkpoints and `on_existing` is
        'refuse'.
      ManifestMismatchError, CheckpointCorruptError: if resuming fails (see
        `ReplayBufferManager.load_replay_buffer`); nothing is deleted.
      ValueError: if a port is in use.
      ManagerStateError: if already started.
    """
    if self._started:
      raise errors.ManagerStateError('this ReplayServer is already started.')
    manager = self._manager
    previous = serving_record.read(manager.checkpoint_dir)
    existing = manager.existing_checkpoints()
    if existing and self._on_existing == 'refuse':
      raise errors.CheckpointExistsError(
          f'{manager.checkpoint_dir} already holds checkpoints ({existing[-1]});'
          " pass on_existing='resume' to continue them or 'overwrite' to "
          'start empty.')
    resumed = False
    if self._on_existing == 'resume':
      try:  # Also when only an interrupted first commit is there to adopt.
        manager.load_replay_buffer()
        resumed = True
      except errors.CheckpointNotFoundError:
        pass
    if resumed:
      self._last_checkpoint = manager.loaded_checkpoint
      self._last_checkpoint_counts = _saved_counts(self._last_checkpoint)
      logging.info('Resumed %s: %s items.', self._last_checkpoint,
                   {n: t['items'] for n, t in
                    manager.loaded_manifest['counts']['tables'].items()})
    else:
      manager.create_replay_buffer(overwrite=bool(existing))
      self._last_checkpoint_counts = (0, 0)
    self._started = True
    self._restart_loss = serving_record.lost_since(
        previous, checkpoint=self._last_checkpoint,
        restored_inserts=self._last_checkpoint_counts[0])
    # Who this server is, for clients that reconnect after a restart: items
    # they had confirmed after the restored save began are lost.
    self._instance = {
        'id': uuid.uuid4().hex, 'restored_checkpoint': self._last_checkpoint,
        'restored_save_started': _save_started(
            manager.loaded_manifest if self._last_checkpoint else None),
        'restart_loss': self._restart_loss}
    if self._restart_loss and not self._restart_loss['lost_items']:
      logging.info('The previous server of this buffer stopped without its '
                   'final checkpoint; %s holds every insert it recorded.',
                   self._last_checkpoint)
    elif self._restart_loss:
      logging.warning(
          'The previous server of this buffer (pid %s on %s, last seen %s) '
          'stopped without its final checkpoint: at least %d item(s) it '
          'inserted after %s were lost. Writers that were connected count '
          'theirs in lost_items.', self._restart_loss['previous_pid'],
          self._restart_loss['previous_host'],
          self._restart_loss['last_seen'], self._restart_loss['lost_items'],
          self._last_checkpoint or 'its start (it had no checkpoint)')
    try:
      port = int(manager.server_address.rpartition(':')[2])
      self._control = control_lib.ControlServer(
          {'info': self._info, 'checkpoint': self._checkpoint_request,
           'times_sampled': self._times_sampled},
          port=self._control_port or control_lib.default_control_port(port))
    except BaseException:
      self.close(final_checkpoint=False)
      raise
    self._last_checkpoint_time = time.monotonic()
    self._last_log = (time.monotonic(), manager.stats())
    self._record(self._counts(self._last_log[1])[0], clean=False)
    logging.warning(SECURITY_WARNING.format(port=port,
                                            control_port=self._control.port))
    return self

  @property
  def manager(self) -> manager_lib.ReplayBufferManager:
    """The served buffer's manager."""
    return self._manager

  @property
  def address(self) -> str:
    """'host:port' of the Reverb server as other machines reach it."""
    return f'{socket.gethostname()}:{self.port}'

  @property
  def port(self) -> int:
    """The Reverb port."""
    return int(self._manager.server_address.rpartition(':')[2])

  @property
  def control_port(self) -> int:
    """The control service's port."""
    return self._control.port

  @property
  def restart_loss(self) -> Optional[Dict[str, Any]]:
    """What the previous server lost by stopping without its final
    checkpoint (see `serving_record.lost_since`), or None."""
    return self._restart_loss

  @property
  def last_checkpoint(self) -> Optional[str]:
    """The newest checkpoint written or resumed (None before the first)."""
    return self._last_checkpoint

  # ---------------------------------------------------------- control service

  def _info(self, request: Dict[str, Any]) -> Dict[str, Any]:
    del request
    manager = self._manager
    return {'config': manager.buffer_config,
            'checkpoint_dir': manager.checkpoint_dir,
            'keep_checkpoints': manager.keep_checkpoints,
            'checkpoints': list(manager.existing_checkpoints()),
            'instance': self._instance}

  def _record(self, inserts: int, *, clean: bool) -> None:
    """Updates `serving_record` (a failure is logged: serving goes on)."""
    try:
      serving_record.write(self._manager.checkpoint_dir, inserts=inserts,
                           clean=clean)
      self._recorded_inserts = inserts
    except OSError as e:
      logging.warning('Could not update %s (%s); a crash now would be '
                      'counted short.', serving_record.RECORD_FILE, e)

  def _checkpoint_request(self, request: Dict[str, Any]) -> str:
    return self.checkpoint(extra=request.get('extra'), reason='a client asked')

  def _times_sampled(self, request: Dict[str, Any]) -> Dict[str, Any]:
    del request
    tables = self._manager.stats(times_sampled=True)['tables']
    return {name: {str(key): n for key, n in t['times_sampled'].items()}
            for name, t in tables.items()}

  # ------------------------------------------------------------ checkpointing

  @staticmethod
  def _counts(stats: Dict[str, Any]):
    return tuple(sum(t[key] for t in stats['tables'].values())
                 for key in ('inserts', 'samples'))

  def checkpoint(self, *, extra: Optional[Dict[str, Any]] = None,
                 reason: str = 'requested') -> str:
    """Writes a checkpoint now (see `ReplayBufferManager.checkpoint`).

    Args:
      extra: JSON-serializable metadata for the manifest.
      reason: why, for the log line.

    Returns:
      The new checkpoint folder.

    Raises:
      WaitTimeoutError, CheckpointCorruptError: if writing fails.
    """
    started = time.monotonic()
    path = self._manager.checkpoint(extra=extra)
    counts = _saved_counts(path)
    with self._lock:  # Control threads and the poll loop both get here.
      if self._last_checkpoint is None or path > self._last_checkpoint:
        self._last_checkpoint, self._last_checkpoint_counts = path, counts
      self._last_checkpoint_time = time.monotonic()
    logging.info('Checkpoint %s (%s) in %.1f s: %s inserts, %s samples in all.',
                 path, reason, time.monotonic() - started, *counts)
    return path

  def poll(self) -> Optional[str]:
    """Writes a scheduled checkpoint and a status line if they are due.

    A scheduled checkpoint is skipped while nothing was inserted or sampled
    since the last one. A failed scheduled checkpoint is logged and retried
    at the next poll; serving goes on.

    Returns:
      The path of the checkpoint written, or None.

    Raises:
      ManagerStateError: if the server is closed.
    """
    now = time.monotonic()
    path = None
    try:
      stats = self._manager.stats()
    except errors.WaitTimeoutError as e:  # Busy; try again at the next poll.
      logging.warning('The buffer did not answer in time (%s); serving goes '
                      'on.', e)
      return None
    inserts, samples = self._counts(stats)
    last_inserts, last_samples = self._last_checkpoint_counts
    if inserts == last_inserts:
      self._unsaved_since = None
    elif self._unsaved_since is None:
      self._unsaved_since = now
    due = []
    if self._every_s and now - self._last_checkpoint_time >= self._every_s:
      due.append(f'every {self._every_s:g} s')
    if self._every_inserts and inserts - last_inserts >= self._every_inserts:
      due.append(f'{inserts - last_inserts} inserts')
    if (self._max_unsaved_s and self._unsaved_since is not None and
        now - self._unsaved_since >= self._max_unsaved_s):
      due.append(f'{inserts - last_inserts} inserts unsaved for '
                 f'{now - self._unsaved_since:.0f} s')
    if due and (inserts, samples) == (last_inserts, last_samples):
      self._last_checkpoint_time = now  # Nothing changed: nothing to save.
    elif due and now >= self._retry_at:
      path = self._scheduled_checkpoint(' and '.join(due), now)
    if inserts != self._recorded_inserts:
      self._record(inserts, clean=False)
    if now - self._last_log[0] >= self._log_every_s:
      logging.info('%s', self.status_line(stats, now))
      self._last_log = (now, stats)
    return path

  def _scheduled_checkpoint(self, reason: str, now: float) -> Optional[str]:
    """Writes a scheduled checkpoint; a failure is logged, not raised."""
    try:
      path = self.checkpoint(reason=reason)
    except (errors.WaitTimeoutError, errors.CheckpointCorruptError,
            OSError) as e:  # CheckpointWriteError is an OSError.
      first = now if self._failing_since is None else self._failing_since[0]
      self._failing_since = (first, str(e))  # The latest cause.
      self._retry_at = now + self._retry_s
      logging.error('Scheduled checkpoint failed (retrying in %g s; serving '
                    'goes on, items since the last checkpoint are not saved '
                    'yet): %s', self._retry_s, e)
      return None
    if self._failing_since is not None:
      logging.warning('Checkpointing works again after failing for %.0f s.',
                      now - self._failing_since[0])
    self._failing_since, self._retry_at = None, 0.0
    return path

  def status_line(self, stats: Dict[str, Any], now: float) -> str:
    """One log line: per table items, insert and sample rates; checkpoints.

    Args:
      stats: `manager.stats()` now.
      now: `time.monotonic()` now.

    Returns:
      The line; rates are since the previous status line.
    """
    then, before = self._last_log
    elapsed = max(now - then, 1e-9)
    parts = [f'serving {self.address}']
    for name, table in stats['tables'].items():
      old = before['tables'][name]
      parts.append(
          f"{name}: {table['items']:,}/{table['max_size']:,} items, "
          f"{(table['inserts'] - old['inserts']) / elapsed:,.1f} inserts/s, "
          f"{(table['samples'] - old['samples']) / elapsed:,.1f} samples/s"
          + ('' if table['rate_limiter']['can_insert'] else
             ', INSERTS BLOCKED by its rate limiter'))
    if self._last_checkpoint:
      ago = now - self._last_checkpoint_time
      parts.append(f'last checkpoint {self._last_checkpoint} '
                   f'({max(ago, 0):.0f} s ago)')
    else:
      parts.append('no checkpoint yet')
    if self._restart_loss and self._restart_loss['lost_items']:
      parts.append(f"the previous server lost {self._restart_loss['lost_items']}"
                   ' item(s) at its crash')
    if self._failing_since is not None:
      since, message = self._failing_since
      parts.append(f'CHECKPOINTS FAILING for {now - since:.0f} s (retry in '
                   f'{max(self._retry_at - now, 0):.0f} s): {message}')
    return ' | '.join(parts)

  def serve_until(self, stop_requested: Callable[[], bool], *,
                  poll_s: float = 0.5) -> Optional[str]:
    """Serves until `stop_requested()` is true, then writes a final checkpoint.

    Args:
      stop_requested: polled every `poll_s` seconds (e.g. a
        `cli.StopRequest` set by SIGTERM/SIGINT).
      poll_s: seconds between polls.

    Returns:
      The final checkpoint (the last one, if nothing changed since).

    Raises:
      ManagerStateError: if not started.
      WaitTimeoutError, CheckpointCorruptError: if the final checkpoint fails.
    """
    if not self._started or self._closed:
      raise errors.ManagerStateError('start() the ReplayServer before serving.')
    try:
      while not stop_requested():
        self.poll()
        time.sleep(poll_s)
    except KeyboardInterrupt:  # A second signal: quit without the final one.
      self.close(final_checkpoint=False)
      raise
    except BaseException:
      self.close()
      raise
    return self.close()

  # ---------------------------------------------------------------- lifecycle

  def close(self, *, final_checkpoint: bool = True) -> Optional[str]:
    """Writes a final checkpoint (if anything changed), stops serving.

    Safe to call more than once. The server stops even if the checkpoint
    fails; the error is raised afterwards.

    Args:
      final_checkpoint: write it; False stops at once, keeping the last one.

    Returns:
      The last checkpoint, or None.

    Raises:
      SmartReplayError: if the final checkpoint fails (e.g. WaitTimeoutError,
        CheckpointCorruptError).
    """
    if self._closed:
      return self._last_checkpoint
    self._closed = True
    failure = None
    try:
      if final_checkpoint and self._started:
        changed = self._counts(self._manager.stats()) != \
            self._last_checkpoint_counts
        if changed or self._last_checkpoint is None:
          self.checkpoint(reason='final')
    except errors.SmartReplayError as e:
      failure = e
      logging.error('The final checkpoint failed: %s', e)
    finally:
      if self._control is not None:
        self._control.stop()
      self._record_stop()
      self._manager.close()
    if failure:
      raise failure
    return self._last_checkpoint

  def _record_stop(self) -> None:
    """Marks the serving record clean if the last checkpoint holds every
    insert (else the next start counts what is lost)."""
    if not self._started:
      return
    try:
      inserts = self._counts(self._manager.stats())[0]
    except errors.SmartReplayError as e:
      logging.warning('Could not read the final insert count: %s', e)
      return
    self._record(inserts, clean=self._last_checkpoint is not None and
                 inserts == self._last_checkpoint_counts[0])

  def __enter__(self) -> 'ReplayServer':
    """Starts the server (see `start`)."""
    return self.start()

  def __exit__(self, exc_type, exc_value, traceback) -> None:
    """Closes the server: with a final checkpoint unless the block failed."""
    self.close(final_checkpoint=exc_type is None)


@gin.configurable
def serve(*, spec_file: str, checkpoint_dir: str, port: int = 8000,
          stop_requested: Callable[[], bool],
          ready: Callable[[str], None] = print) -> Optional[str]:
  """Loads a spec file and serves its buffer until asked to stop.

  The buffer's capacity, lengths and tables come from gin bindings of
  `ReplayBufferManager` (e.g. configs/serve.gin), the schedule from those of
  `ReplayServer`.

  Args:
    spec_file: the `collect_data_spec`, saved with `specs.save_spec`.
    checkpoint_dir: the buffer directory (created or resumed).
    port: the Reverb port; the control service uses `port + 1` unless
      `ReplayServer.control_port` is bound.
    stop_requested: polled; once true, a final checkpoint is written.
    ready: called with one line giving the addresses once serving.

  Returns:
    The final checkpoint.

  Raises:
    ValueError: if the spec or config is invalid or a port is in use.
    SmartReplayError: if the buffer cannot be created or resumed.
  """
  data_spec = specs.load_spec(spec_file)
  manager = manager_lib.ReplayBufferManager(
      data_spec=data_spec, checkpoint_dir=checkpoint_dir, port=port)
  server = ReplayServer(manager)
  server.start()
  try:
    ready(f'Serving {[c.name for c in manager.table_configs]} at '
          f'{server.address} (Reverb; control at port {server.control_port}); '
          f'on this machine: localhost:{server.port}. Checkpoints in '
          f'{manager.checkpoint_dir}.')
  except BaseException:
    server.close(final_checkpoint=False)
    raise
  return server.serve_until(stop_requested)
