"""Starting and stopping a manager's buffer, and writing to it.

`Serving` is the part of `ReplayBufferManager` behind create/load/connect,
`make_observer`, `flush`, `clear`, `checkpoint` and `close`: it turns what a
backend started (`backends.base.Started`) into the running buffer (replay
buffer, TF client, counts, observers, starter) and takes it down again.
"""

import threading
from typing import Any, Callable, Dict, Optional, Tuple

from absl import logging
import reverb
import tensorflow as tf

from smart_replay import errors
from smart_replay.backends import base as backend_lib
from smart_replay.backends import starter as starter_lib
from smart_replay.manager import journals as journals_lib
from smart_replay.manager import manager_options
from smart_replay.manager import replay_buffer as replay_buffer_lib
from smart_replay.manager import sent_records
from smart_replay.manager import state as state_lib
from smart_replay.manager import watch
from smart_replay.server import checkpointer as checkpointer_lib
from smart_replay.storage import coordinated_records
from smart_replay.writing import observer as observer_lib

Started = Tuple[replay_buffer_lib.ManagedReplayBuffer,
                observer_lib.TrajectoryObserver]
# After an automatic checkpoint failed, the next try waits this long.
AUTOMATIC_RETRY_S = 60.0


class Serving:
  """A buffer's start, observers, checkpoints and close.

  Args:
    state: the manager's state.
    options: the manager's options.
    backend: where the buffer lives.
    samples: the manager's part that makes datasets (the replay buffer's
      `as_dataset`).
  """

  def __init__(self, state: state_lib.State,
               options: manager_options.ManagerOptions,
               backend: backend_lib.Backend, *,
               samples: replay_buffer_lib.Samples):
    self._state, self._options, self._backend = state, options, backend
    self._samples = samples
    self._watcher: Optional[watch.Watcher] = None
    local = options.local
    self._journals = journals_lib.Journals(
        local.checkpoint_dir if local else None, options.writes.journal,
        bound_steps=options.shape.capacity)
    self._sent = sent_records.SentRecords(
        options.writes, None if local else options.location.journal_dir)
    self._bound_stop = threading.Event()
    self._bound_thread: Optional[threading.Thread] = None
    # The `extra` of the last checkpoint the user took (or loaded), which
    # automatic checkpoints carry forward.
    self._user_extra: Dict[str, Any] = {}

  def start(self, start: Callable[[], backend_lib.Started]) -> Started:
    """Runs a backend's start and builds the running buffer on it; on
    failure nothing stays served.

    Args:
      start: the backend's `create`, `load` or `connect` (bound).

    Returns:
      `(replay_buffer, observer)`.
    """
    self._state.require(started=False, where=self._backend.where)
    try:
      started = start()
      if self._backend.watch_interval_s:
        self._watcher = watch.Watcher(self._backend, self._state)
      self._run(started)
    except BaseException:
      self._stop()
      raise
    if started.loaded is not None:
      self._state.resumed(started.loaded)
      self._user_extra = {
          k: v for k, v in (started.loaded['manifest'].get('extra') or
                            {}).items()
          if k != coordinated_records.AUTOMATIC_KEY}
    running = self._state.running
    return running.replay_buffer, running.observers[0]

  def _run(self, started: backend_lib.Started) -> None:
    """The running buffer of what the backend started."""
    options, config = self._options, started.config
    self._journals.choose(
        config.step_layout, options.data_spec,
        blocks=any(t.block_length is not None for t in config.tables))
    first = config.table()
    manifest = started.loaded['manifest'] if started.loaded else None
    self._state.running = running = state_lib.Running(
        client=started.client, config=config,
        replay_buffer=replay_buffer_lib.ManagedReplayBuffer(
            options.data_spec, first.name,
            first.sequence_length if first.kind == 'sequence' else None,
            saves=self, samples=self._samples,
            rate_limiter_timeout_ms=int(
                options.timeouts.sample_timeout_s * 1000), **started.server),
        tf_client=reverb.TFClient(started.client.server_address),
        counts=state_lib.Counts(config, manifest),
        shards=tuple((client, reverb.TFClient(client.server_address))
                     for client in started.shards),
        shards_up=tf.Variable(
            [state['up'] for state in self._backend.server_states()],
            dtype=tf.bool, trainable=False) if started.shards else None)
    running.journals = self._journals
    self._state.serving.assign(True)
    if started.loaded is not None:  # What was written after the checkpoint.
      todo = self._journals.to_replay(manifest)
      if any(item.cleared for item in todo):  # A clear() came after it.
        for name in config.table_names:
          running.client.reset(name)
        running.counts.reset()
      for item in todo:
        self._replay(item)
    self._sent.start()
    self.make_observer(num_envs=options.writes.num_envs)
    if self._journals.enabled:
      self._bound_stop.clear()
      self._bound_thread = threading.Thread(
          target=self._bound_journals, daemon=True, name='journal-bound')
      self._bound_thread.start()
    local = options.local
    running.starter = starter_lib.open_for(
        options.location.starter_dir,
        manifest.get(starter_lib.MANIFEST_KEY) if manifest else None,
        loading=manifest is not None,
        where=started.loaded and started.loaded['path'],
        connect_timeout_s=options.timeouts.connect_timeout_s,
        allow_version_mismatch=bool(local and local.allow_version_mismatch))

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
    running = self._state.require(started=True, where=self._backend.where)
    obs = self._new_observer(running, num_envs=num_envs, priority=priority,
                             journal=True)
    running.observers.append(obs)
    return obs

  def _new_observer(self, running: state_lib.Running, *,
                    num_envs: Optional[int], priority: Optional[float],
                    journal: bool) -> observer_lib.TrajectoryObserver:
    """An observer of the running buffer, with a journal of its own if
    `journal` and the buffer journals."""
    tables = list(running.config.tables)
    names = [t.name for t in tables]
    layout = running.config.step_layout
    kept = journal and self._journals.new_journal(
        layout=layout, data_spec=self._options.data_spec, num_envs=num_envs,
        tables=names)
    sent, adopted = (None, False) if kept or not journal else self._sent.new(
        usable=self._backend.resends and layout.writer_ids,
        layout=layout, data_spec=self._options.data_spec, num_envs=num_envs,
        tables=names,
        block_tables=[t.name for t in tables if t.block_length is not None])
    obs = observer_lib.TrajectoryObserver(
        running.client, tables=tables, data_spec=self._options.data_spec,
        layout=running.config.step_layout, writes=self._options.writes,
        timeouts=self._options.timeouts, num_envs=num_envs,
        priority=priority, priorities=running.counts.priorities,
        lock=self._state.lock,
        wake=self._watcher.wake if self._watcher else None,
        journal=kept or sent or None, keeps_sent=bool(sent))
    if adopted:  # What it kept before this client started, before a step.
      with self._state.lock:
        watch.resend(obs, self._backend)
    return obs

  def _replay(self, item: journals_lib.ToReplay) -> None:
    """Runs a journal again above its mark through an observer of its own
    (not kept: the buffer's counts take what it counted)."""
    running = self._state.running
    obs = self._new_observer(running, num_envs=item.num_envs, priority=None,
                             journal=False)
    try:
      done = obs.replay_journal(item.contents, mark=item.mark,
                                keep_from=item.keep_from)
    finally:
      obs.close()
    running.counts.add_replayed(obs.live_counters.env_steps,
                                obs.num_episodes)
    self._journals.replayed(item, done.after_mark, sum(done.items.values()))
    logging.info(
        'Replayed the journal of writer %s: %d record(s) after the '
        "checkpoint's mark %d (%d steps; items %s).",
        item.contents.writer_id, done.after_mark, item.mark,
        done.counted[0], done.items)

  def _bound_journals(self) -> None:
    """A thread's loop: whenever a journal holds more steps than the
    buffer's capacity above the last checkpoint, takes an automatic
    checkpoint (which lets the journals drop what it covers); one that fails
    is logged and tried again after `AUTOMATIC_RETRY_S`, the journals
    keeping everything meanwhile."""
    journals, stop = self._journals, self._bound_stop
    while not stop.is_set():
      if not journals.over_bound.wait(1.0) or stop.is_set():
        continue
      journals.over_bound.clear()
      running = self._state.running
      with self._state.lock:
        if running is None or not journals.over(running.observers):
          continue  # A checkpoint covered it meanwhile.
      try:
        path = self.checkpoint(extra={
            **self._user_extra, coordinated_records.AUTOMATIC_KEY: True})
      except Exception as e:  # pylint: disable=broad-except
        if stop.is_set():
          break
        logging.error(
            'The automatic checkpoint that bounds the journals failed (%s: '
            '%s); the journals keep every step, and it is tried again in '
            '%g s.', type(e).__name__, e, AUTOMATIC_RETRY_S)
        if not stop.wait(AUTOMATIC_RETRY_S):
          journals.over_bound.set()
        continue
      journals.automatic_checkpoints += 1
      logging.info(
          'A journal held more steps than the buffer\'s capacity (%s) above '
          'the last checkpoint: took the automatic checkpoint %s, kept beside '
          'yours (it never displaces one you took).',
          self._options.shape.capacity, path)

  def _stop_bound(self) -> None:
    """Stops the journals' bound thread (before the lock is taken: it may
    be checkpointing), waiting for a checkpoint it is taking."""
    self._bound_stop.set()
    self._journals.over_bound.set()  # Wakes its wait at once.
    thread, self._bound_thread = self._bound_thread, None
    if thread is not None and thread is not threading.current_thread():
      thread.join(self._options.timeouts.checkpoint_timeout_s * 2 + 10)

  def _check_restart(self) -> None:
    """If the observers' server was restarted since the last check, every
    observer counts the items it had confirmed that the restart lost (each
    restart once: the watcher's check, a flush or a checkpoint)."""
    watch.after_restart(self._state, self._backend,
                        self._backend.restarted(patient=True))

  def flush(self) -> None:
    """Flushes every observer of this manager.

    Raises:
      WaitTimeoutError: if the server does not accept pending items in time.
      ServerUnavailableError, WriteFailedError: if an observer lost steps
        (see `TrajectoryObserver`).
    """
    if self._state.running is not None:
      self._state.running.flush()
      self._check_restart()

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
    with self._state.lock:
      running = self._state.require(started=True, where=self._backend.where)
      for obs in running.observers:
        obs.end_episode()
      self._journals.cleared(running.observers)
      for obs in running.observers:
        if obs.retains:  # Nothing before it is sent again after a restart.
          obs.journal_cleared()
      for name in running.config.table_names:
        running.client.reset(name)
      for obs in running.observers:
        obs.reset_counters()
      running.counts.reset()

  def checkpoint(self, *, extra: Optional[Dict[str, Any]] = None,
                 writer_marks: bool = False) -> str:
    """Flushes the observers and writes a verified checkpoint.

    Writing through this manager pauses meanwhile, so the manifest's counts
    describe exactly what was saved. In client mode the server writes it into
    its own directory (the path is on its machine).

    Args:
      extra: JSON-serializable metadata for the manifest, e.g.
        `{'train_step': 1000}`.
      writer_marks: record in the manifest, for each writer, the last of
        its calls each table holds, read from the saved files (a served
        buffer does, for its remote writers; costs a read of the item list,
        about 20 µs per item). Client mode: the server decides.

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
    if self._state.running is not None:
      self._check_restart()  # Count a restart's loss before saving on.
    with self._state.lock:
      running = self._state.require(started=True, where=self._backend.where)
      self._backend.wait_for_pending_save()
      running.flush()
      counts = running.counts.manifest_counts(running.observers)
      marks = self._journals.marks(running.observers)
      if marks is not None:
        counts[journals_lib.MARKS_KEY] = marks
      path = self._backend.checkpoint(
          extra=extra, counts=counts,
          starter=running.starter.reference() if running.starter else None,
          writer_marks=writer_marks)
      self._journals.committed(running.observers, marks)
      if not (extra or {}).get(coordinated_records.AUTOMATIC_KEY):
        self._user_extra = dict(extra or {})
      return path

  def _stop(self) -> None:
    """Stops serving: the backend and the starter stop, the running buffer
    is dropped."""
    self._state.serving.assign(False)
    self._stop_watch()
    self._stop_bound()
    running, self._state.running = self._state.running, None
    if running is not None:
      running.batchers.close()  # Their iterators raise from now on.
    if running is not None and running.starter is not None:
      running.starter.close()
    self._backend.stop()
    self._sent.close()

  def _stop_watch(self) -> None:
    """Stops the watcher (before the lock is taken: a check may be waiting
    for it)."""
    if self._watcher is not None:
      self._watcher.stop()
      self._watcher = None

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
    self._stop_watch()
    self._stop_bound()
    with self._state.lock:
      if self._state.closed:
        return
      self._state.closed = True
      failure = None
      running = self._state.running
      for obs in running.observers if running else ():
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
      self._stop()
      self._backend.release()
    if failure:
      raise failure
