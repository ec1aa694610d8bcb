"""A standalone replay buffer server for actors and learners in other processes.

`ReplayServer` runs a `ReplayBufferManager`'s Reverb server for remote clients
(`ReplayBufferManager(server_address=...)`): it creates the buffer, or resumes
its newest verified checkpoint, writes checkpoints on a schedule (every N
seconds and/or N inserted items) and on request of a client, writes a final
one when asked to stop, and logs table sizes and insert/sample rates at an
interval. Clients reach it on two ports: Reverb's (data) and the control
service's (`smart_replay.control.server`). The schedule is in `schedule`, the
status line in `status`, the control methods in `handlers`; `launch.serve()`
is what the `smart-replay-serve` binary runs.
"""

import socket
import threading
import time
from typing import Any, Callable, Dict, Optional

from absl import logging
import gin

from smart_replay import errors
from smart_replay.manager import facade as manager_lib
from smart_replay.remote import control_service
from smart_replay.remote import opening
from smart_replay.remote import requests
from smart_replay.remote import checkpoint_schedule as schedule_lib
from smart_replay.remote import serving_record
from smart_replay.remote import status
from smart_replay.control import protocol
from smart_replay.control import access as control_access
from smart_replay.utils import checks
from smart_replay.utils import ports

ON_EXISTING = ('resume', 'overwrite', 'refuse')
# Ports tried for a control service whose port and Reverb's are automatic.
_CONTROL_ATTEMPTS = 3


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
    control_port: port of the control service; default the Reverb port + 1
      (checked free before the buffer opens when either port was given;
      with both automatic, another free port if a process took that one).
    access: where the control service listens and who may call it
      (`control_access.ControlAccess`: loopback and a token by default).
    checkpoint_every_s, checkpoint_every_inserts, max_unsaved_s,
      checkpoint_retry_s: the checkpoint schedule (every N seconds, every N
      inserted items, once unsaved items are N seconds old) and the wait
      after a failed scheduled checkpoint; see `CheckpointSchedule`'s
      `every_s`, `every_inserts`, `max_unsaved_s` and `retry_s`.
    log_every_s: seconds between status log lines (table sizes, rates).
    on_existing: what to do when `checkpoint_dir` already holds checkpoints:
      'resume' the newest verified one (a restart after a crash), 'overwrite'
      them with an empty buffer, or 'refuse' to start.

  Raises:
    ValueError: if an argument is invalid; names it and its value.
  """

  def __init__(self, manager: manager_lib.ReplayBufferManager, *,
               control_port: Optional[int] = None,
               access: Optional[control_access.ControlAccess] = None,
               checkpoint_every_s: Optional[float] = None,
               checkpoint_every_inserts: Optional[int] = None,
               max_unsaved_s: Optional[float] = 300.0,
               checkpoint_retry_s: float = 30.0,
               log_every_s: float = 60.0, on_existing: str = 'resume'):
    if not isinstance(manager, manager_lib.ReplayBufferManager):
      raise ValueError(f'manager must be a ReplayBufferManager, got '
                       f'{manager!r}.')
    self._schedule = schedule_lib.CheckpointSchedule(
        every_s=checkpoint_every_s, every_inserts=checkpoint_every_inserts,
        max_unsaved_s=max_unsaved_s, retry_s=checkpoint_retry_s)
    checks.positive('log_every_s', log_every_s)
    if on_existing not in ON_EXISTING:
      raise ValueError(f'on_existing must be one of {ON_EXISTING}, got '
                       f'{on_existing!r}.')
    if control_port is not None:
      protocol.check_port('control_port', control_port)
    self._access = access or control_access.ControlAccess()
    if not isinstance(self._access, control_access.ControlAccess):
      raise ValueError(f'access must be a ControlAccess, got {access!r}.')
    self._manager = manager
    self._control_port = control_port
    self.secrets = control_access.ServerSecrets()
    self._log_every_s = float(log_every_s)
    self._on_existing = on_existing
    # The control service; (time, stats) of the previous status line.
    self._control = self._last_log = None
    # Held by checkpoints, polls and reloads (control threads and the poll
    # loop reach them).
    self._lock = threading.RLock()
    # Client-requested checkpoints: coalesced, in their own retention group.
    # Saves clients ask for (requested and coordinated), spaced in time.
    self.spacing = requests.Spacing()
    self._requests = requests.CheckpointRequests(
        lambda extra: self.checkpoint(extra=extra, reason='a client asked'),
        self._lock, spacing=self.spacing)
    self._started = self._closed = False
    self._restart_loss = self._instance = None
    self._broken = None  # The error that left nothing to serve, if any.
    self._recorder = serving_record.Recorder(manager.checkpoint_dir)

  def start(self) -> 'ReplayServer':
    """Creates or resumes the buffer and starts the control service.

    Returns:
      The server itself.

    Raises:
      CheckpointExistsError: if there are checkpoints and `on_existing` is
        'refuse'.
      ManifestMismatchError, CheckpointCorruptError: if resuming fails (see
        `ReplayBufferManager.load_replay_buffer`); nothing is deleted.
      AuthenticationError: if the token file cannot be read or created, or
        is open to other users.
      ValueError: if a port is in use.
      ManagerStateError: if already started.
    """
    if self._started:
      raise errors.ManagerStateError('this ReplayServer is already started.')
    manager = self._manager
    given = self._given_control_port()  # Checked before anything opens.
    # Before opening: a folder or token file that is not safe stops it.
    self.secrets = self._access.secrets(manager.checkpoint_dir)
    previous = serving_record.read(manager.checkpoint_dir)
    schedule = self._schedule
    if opening.open_buffer(manager, on_existing=self._on_existing):
      schedule.record(manager.loaded_checkpoint,
                      schedule_lib.saved_counts(manager.loaded_checkpoint),
                      time.monotonic())
    else:
      schedule.last_counts = (0, 0)
    self._started = True
    restored = schedule.last_checkpoint
    self._restart_loss = serving_record.lost_since(
        previous, checkpoint=restored,
        restored_inserts=schedule.last_counts[0])
    self._instance = serving_record.describe_instance(
        restored_checkpoint=restored,
        restored_manifest=manager.loaded_manifest if restored else None,
        restart_loss=self._restart_loss)
    serving_record.log_restart_loss(self._restart_loss, restored)
    try:
      self._control = self._serve_control(given)
    except BaseException:
      self.close(final_checkpoint=False)
      raise
    schedule.last_time = time.monotonic()
    self._last_log = (time.monotonic(), manager.stats())
    self._recorder.update(schedule_lib.total_counts(self._last_log[1])[0])
    return self

  def _given_control_port(self) -> Optional[int]:
    """The control port the user chose (`control_port`, else the given
    Reverb port + 1), checked free; None if both ports are automatic.

    Raises:
      ValueError: if that port is in use; names `control_port`.
    """
    reverb_port = self._manager.options.location.port
    if self._control_port is None and reverb_port is None:
      return None
    port = self._control_port or protocol.default_control_port(reverb_port)
    if not ports.is_free(port):
      which = ('the control port' if self._control_port else
               f"the control port, Reverb's port {reverb_port} + 1,")
      raise ValueError(
          f'{which} {port} is in use by another process; pass another free '
          'port as control_port (smart-replay-serve: --control_port), or '
          'another Reverb port.')
    return port

  def _serve_control(self, port: Optional[int]) -> Any:
    """Starts the control service on `port`; if None, on the Reverb port + 1
    or, when a process took that one meanwhile, on another free port (which
    clients learn from `control_port` and the ready line).

    Raises:
      ValueError: if the port cannot be bound.
    """
    candidate = self.port + 1 if port is None else port
    for attempt in range(1, _CONTROL_ATTEMPTS + 1):
      try:
        return control_service.serve_control(
            self, instance=self._instance,
            checkpoint=self._requests.request,
            exclusive=lambda: self._lock, access=self._access,
            secrets=self.secrets, port=candidate)
      except ValueError as e:
        if port is not None or attempt == _CONTROL_ATTEMPTS:
          raise
        candidate = ports.free_port_pair()
        logging.warning('%s Trying port %d instead (clients learn it from '
                        'the ready line and ReplayServer.control_port).', e,
                        candidate)

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
    """What the last server lost without a final checkpoint, or None."""
    return self._restart_loss

  @property
  def token_file(self) -> Optional[str]:
    """The operator token file clients copy (None without tokens)."""
    return self.secrets.operator_file

  @property
  def reader_token_file(self) -> Optional[str]:
    """The reader token file (read-only methods, metrics), or None."""
    return self.secrets.reader_file

  @property
  def schedule(self) -> schedule_lib.CheckpointSchedule:
    """The checkpoint schedule: the last checkpoint, its time, failures."""
    return self._schedule

  @property
  def last_checkpoint(self) -> Optional[str]:
    """The newest checkpoint written or resumed (None before the first)."""
    return self._schedule.last_checkpoint

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
    with self._lock:
      started = time.monotonic()
      # Marks: what remote writers re-send from after a restart.
      path = self._manager.checkpoint(extra=extra, writer_marks=True)
      counts, done = schedule_lib.saved_counts(path), time.monotonic()
      self._schedule.record(path, counts, done, duration_s=done - started)
    logging.info('Checkpoint %s (%s) in %.1f s: %s inserts, %s samples in all.',
                 path, reason, done - started, *counts)
    return path

  def reload(self, path: str, *, reason: str) -> str:
    """Restores this buffer's checkpoint `path` in place, then checkpoints
    (so a later restart resumes this state); see `opening.restore`.

    Args:
      path: one of this buffer's `ckpt-N` folders.
      reason: why, for the log.

    Returns:
      The checkpoint written after the restore.

    Raises:
      ManagerStateError: if not serving.
      CheckpointCorruptError, CheckpointNotFoundError,
        ManifestMismatchError: if `path` is not a verified checkpoint of
        this buffer; the buffer serves on untouched.
      opening.ReopenFailed: if nothing could be reopened once the buffer
        stopped; the server then stops serving.
    """
    with self._lock:
      if not self._started or self._closed:
        raise errors.ManagerStateError('the ReplayServer is not serving.')
      try:
        self._manager, failure, self._restart_loss = opening.restore(
            self._manager, path, reason=reason)
      except opening.ReopenFailed as e:
        logging.error('%s', e)
        self._broken = e
        raise
      loaded = self._manager.loaded_checkpoint
      self._schedule.restored(loaded, schedule_lib.saved_counts(loaded),
                              time.monotonic())
      self._instance.update(serving_record.describe_instance(
          restored_checkpoint=loaded, restart_loss=self._restart_loss,
          restored_manifest=self._manager.loaded_manifest, on_request=True))
      self._last_log = (time.monotonic(), self._manager.stats())
      if failure:
        raise failure
      return self.checkpoint(reason=f'after restoring {reason}')

  def poll(self) -> Optional[str]:
    """Writes a scheduled checkpoint and a status line if they are due.

    A scheduled checkpoint is skipped while nothing was inserted or sampled
    since the last one. A failed scheduled checkpoint is logged and retried
    at the next poll; serving goes on.

    Returns:
      The path of the checkpoint written, or None.

    Raises:
      ManagerStateError: if the server is closed.
      opening.ReopenFailed: if a restore left nothing to serve.
    """
    with self._lock:
      if self._broken is not None:
        raise self._broken
      now, path = time.monotonic(), None
      try:
        stats = self._manager.stats()
      except errors.WaitTimeoutError as e:  # Busy; try again next poll.
        logging.warning('The buffer did not answer in time (%s); serving '
                        'goes on.', e)
        return None
      inserts, samples = schedule_lib.total_counts(stats)
      reason = self._schedule.due((inserts, samples), now)
      if reason:
        path = self._schedule.attempt(
            lambda: self.checkpoint(reason=reason), now)
      self._recorder.update(inserts)
      if now - self._last_log[0] >= self._log_every_s:
        logging.info('%s', self.status_line(stats, now))
        self._last_log = (now, stats)
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
    return status.status_line(
        address=self.address, stats=stats, before=before,
        elapsed_s=now - then, schedule=self._schedule,
        restart_loss=self._restart_loss, now=now)

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
      return self._schedule.last_checkpoint
    self._closed = True
    failure = None
    try:
      if final_checkpoint and self._started and self._broken is None:
        changed = not self._schedule.holds(
            schedule_lib.total_counts(self._manager.stats()))
        if changed or self._schedule.last_checkpoint is None:
          self.checkpoint(reason='final')
    except errors.SmartReplayError as e:
      failure = e
      logging.error('The final checkpoint failed: %s', e)
    finally:
      if self._control is not None:
        self._control.stop()
      if self._started and self._broken is None:
        self._recorder.stopped(
            lambda: schedule_lib.total_counts(self._manager.stats())[0],
            saved=(self._schedule.last_counts[0]
                   if self._schedule.last_checkpoint else None))
      self._manager.close()
    if failure:
      raise failure
    return self._schedule.last_checkpoint

  def __enter__(self) -> 'ReplayServer':
    """Starts the server (see `start`)."""
    return self.start()

  def __exit__(self, exc_type, exc_value, traceback) -> None:
    """Closes the server: with a final checkpoint unless the block failed.

    Args:
      exc_type: the exception the block raised, or None.
      exc_value: unused.
      traceback: unused.
    """
    self.close(final_checkpoint=exc_type is None)

