"""A validating trajectory observer for `tf_agents.train.Actor`.

The observer checks every step against the spec (`step_validation`), writes
it once and makes the items of every table from it; takes one environment's
steps or `num_envs` batched ones (one stream, with its own episodes, per
environment); bounds every wait on the server by a timeout and stays at most
~50 items ahead of it (back-pressure); and survives a remote server's
restart: it waits up to `reconnect_timeout_s` for Reverb's writer to
reconnect, then raises `ServerUnavailableError` and counts what it could not
store (`num_lost_steps`, `num_lost_items`).

The work is split: `planner.StreamPlan` decides which items each step
completes, `writer.StreamWriter` sends them, `counters.Counters` counts, a
`packed_steps.Layout` turns a step's fields into Reverb columns, and
`block_writer.BlockWriter` writes the tables of packed items.
"""

import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Union

import reverb
from absl import logging

from smart_replay import errors
from smart_replay.config import options
from smart_replay.config import reverb_tables
from smart_replay.config import tables as tables_lib
from smart_replay.layouts import packed_steps
from smart_replay.spec import specs
from smart_replay.server import priorities as priorities_lib
from smart_replay.spec import validation as step_validation
from smart_replay.storage import journal as journal_lib
from smart_replay.storage import journal_segments
from smart_replay.storage import retained as retained_lib
from smart_replay.writing import block_writer
from smart_replay.writing import chunking
from smart_replay.writing import confirmations as confirmations_lib
from smart_replay.writing import counters as counters_lib
from smart_replay.writing import journaling
from smart_replay.writing import planner as planner_lib
from smart_replay.writing import resending
from smart_replay.writing import settings as settings_lib
from smart_replay.writing import writer as writer_lib


class TrajectoryObserver:
  """Writes trajectories as the items of every configured table.

  Sequence tables get an item of `sequence_length` steps every
  `stride_length` steps, never straddling two episodes (unless
  `cross_episodes`): a LAST step ends an episode, and so does a FIRST step
  arriving mid-episode (e.g. a new `Actor`). Shorter episodes give no item
  (counted in `num_short_episodes`). Episode tables get one item per
  episode (see `TableConfig` for episodes longer than `episode_length`).
  Tables of packed items get blocks of steps (`block_writer.BlockWriter`).

  Use it as an `Actor` observer: a callable with `flush()` and `close()`.

  Attributes:
    chunk_length: the steps per Reverb chunk it writes.
    num_steps, num_episodes, num_items, items_per_table: what it wrote.
    num_short_episodes, num_short_episode_steps, num_long_episodes,
      num_dropped_episodes: episodes too short or too long for some table
      (see `Counters`).
    num_lost_steps, num_lost_items: written but never stored: the server
      stayed unreachable past `reconnect_timeout_s` (which raised).
    num_reconnects: times the server came back while a write waited for it.
    num_lost_at_restart: items the server had confirmed that a restart of it
      lost (part of `num_lost_items`; see `count_restart_loss`).
    confirmations: when this observer's items were confirmed
      (`ConfirmationLog`).
    live_counters: the `Counters` behind every `num_*` attribute.
    writer_id: this observer's id (16 hex digits; its journal's, else
      random): with a layout of `writer_ids`, every step it stores carries
      it and the number of the call that wrote the step (its journal
      record), which checkpoints read back as marks (`storage.
      writer_marks`).
    resender: sends again what a restarted server lacks of this
      observer's items (`resending.Resender`), if its journal keeps what it
      sent (`keeps_sent`); else None.

  Args:
    client: a `reverb.Client` of the server holding the tables.
    tables: the resolved configs of the tables to write (see
      `TableConfig.resolve`).
    data_spec: the spec of one step (e.g. `agent.collect_data_spec`).
    layout: how a step's fields become Reverb columns, a
      `protocol.StepLayout` whose `step_spec` made the tables; default one
      column per field.
    writes: how it writes (`WriteOptions`: `chunk_length`, None picks
      `chunking.auto_chunk_length`; `non_finite` for a NaN or +-Inf in a
      float field: 'error' refuses the step with `TrajectorySpecError`,
      'warn' writes it and warns once per field, 'allow' writes it;
      `float_bounds` the same for a finite float outside its bounded spec).
      Its `num_envs` is the manager's default, not this observer's.
    timeouts: how long it waits (`Timeouts`: `write_timeout_s` for episode
      ends, flushes and closes to be accepted, `reconnect_timeout_s` while
      the server does not answer, e.g. restarting; Reverb's writer
      reconnects on its own).
    num_envs: None for unbatched steps; otherwise every call takes a batch of
      this many environments' steps (outer dimension), written as
      `num_envs` independent streams.
    priority: initial priority of every new item; None uses each table's
      `initial_priority`, or `priorities` for tables without one.
    priorities: the buffer's `server.priorities.Priorities`: a prioritized
      table setting no `initial_priority` gives new items its largest
      priority so far when `priority` is None; None: 1.0.
    lock: a re-entrant lock held while a step is written (the manager's, so
      a checkpoint sees whole steps).
    wake: set after a write waited for the server and it answered again (the
      client-mode manager's watcher then checks at once whether the server
      was restarted, and tells this observer what it lost:
      `count_restart_loss`); None: nobody to tell.
    journal: a write-ahead journal (`storage.journal.JournalWriter`, made
      with `journaling.journal_meta`), or the records a remote writer
      keeps in memory (`storage.retained.RetainedRecords`): each call is
      recorded in it (`journaling`), and the observer closes it; None:
      none.
    keeps_sent: the journal keeps what this observer sent to a server that
      may restart from an older checkpoint, to send it again (`resender`).

  Step types (FIRST=0, MID=1, LAST=2 only, in `step_type` and
  `next_step_type`) and integer fields outside their bounds are always
  refused: the observer ends episodes by the former, and an integer action
  outside its bounds cannot be a valid action.

  Raises:
    ValueError: on a bad argument; the message names it and its value.
  """

  def __init__(self, client: reverb.Client, *,
               tables: Sequence[tables_lib.TableConfig], data_spec: Any,
               layout: Optional[packed_steps.Layout] = None,
               writes: Optional[options.WriteOptions] = None,
               timeouts: Optional[options.Timeouts] = None,
               num_envs: Optional[int] = None,
               priority: Optional[float] = None,
               priorities: Optional[priorities_lib.Priorities] = None,
               lock: Optional[threading.RLock] = None,
               wake: Optional[threading.Event] = None,
               journal: Union[journal_lib.JournalWriter,
                     retained_lib.RetainedRecords, None] = None,
               keeps_sent: bool = False):
    _check_arguments(tables, num_envs=num_envs, priority=priority)
    writes = writes or options.WriteOptions()
    timeouts = timeouts or options.Timeouts()
    # Raises on bad value policies or spec. The bound `__call__` saves ~50 ns
    # a step over calling the instance (CPython 3.11).
    self._validate = step_validation.StepValidator(
        data_spec, num_envs=num_envs, non_finite=writes.non_finite,
        float_bounds=writes.float_bounds).__call__
    self._client = client
    self._pid = os.getpid()
    self._lock = lock or threading.RLock()
    self._tables = list(tables)
    step_tables = [t for t in tables if t.block_length is None]
    self._writes_steps = bool(step_tables)
    paths = [leaf.path for leaf in specs.flatten_spec(data_spec)]
    self._step_type = paths.index('step_type')
    self._num_envs = num_envs
    self._layout = layout or packed_steps.Layout('columns', data_spec)
    self.chunk_length = writes.chunk_length or chunking.auto_chunk_length(
        self._layout.step_spec)
    lookback = self._layout.lookback  # Cells before an item's first step.
    keep_alive = chunking.keep_alive_steps(
        self.chunk_length, max((t.item_length for t in step_tables),
                               default=1) + lookback)
    self._counters = counters_lib.Counters.for_tables(
        self.table_names, [t.name for t in self._tables if t.kind == 'episode'])
    # When items were confirmed (to count what a server restart lost).
    self.confirmations = confirmations_lib.ConfirmationLog()
    planner = planner_lib.ItemPlanner(
        step_tables, counters=self._counters, priority=priority,
        priority_fn=priorities and priorities.new_item_priority)
    settings = settings_lib.WriterSettings(
        client=client, chunk_length=self.chunk_length, keep_alive=keep_alive,
        timeout_ms=int(timeouts.write_timeout_s * 1000),
        reconnect_timeout_s=float(timeouts.reconnect_timeout_s),
        clear_at_episode_end=planner.clear_at_episode_end,
        # What each table's items look like, to check a server that came
        # back.
        signatures={t.name: specs.describe_signature(
            reverb_tables.signature(t, self._layout.step_spec, lookback))
                    for t in step_tables},
        counters=self._counters, confirmations=self.confirmations,
        reconnected=wake, num_columns=self._layout.num_columns,
        encoder=self._layout.encoder, lookback=lookback)
    # What each call does goes to the journal, if there is one.
    self._log = journal and journaling.CallLog(
        journal, tables=self.table_names, keep_alive=keep_alive,
        num_streams=num_envs or 1,
        step_types=any(t.block_length is not None for t in tables),
        cells=self._layout.journals_cells)
    # One (plan, writer) per environment.
    self._streams = []
    for index in range(num_envs or 1):
      out = (journaling.RecordedStream(settings, self._log, index)
             if self._log else writer_lib.StreamWriter(settings))
      plan = planner.stream(out.defer)
      out.on_restart = plan.restart
      self._streams.append((plan, out))
    # The writer ids every stored step carries (`Layout.writer_ids`): this
    # observer's id (its journal's, which a restart keeps) and the number
    # of the call (its journal record).
    self.writer_id = (journal.writer_id if journal else
                      journal_segments.new_writer_id())
    self._writer_key = int(self.writer_id, 16)
    self._calls = 0  # Calls that wrote steps, without a journal.
    # None for a layout without writer ids: nothing to call per step.
    self._stamp = self._layout.writer_ids and self._layout.stamp_ids
    block_tables = [t for t in tables if t.block_length is not None]
    self._blocks = block_tables and block_writer.BlockWriter(
        block_tables, settings=settings, layout=self._layout,
        num_streams=num_envs or 1)
    self._closed = False
    # Sends again what a restarted server lacks (`resending`), if the
    # journal keeps what this observer sent.
    self.resender = self._log and keeps_sent and resending.Resender(
        log=self._log, settings=settings, counters=self._counters,
        lock=self._lock, tables=self.table_names, block_tables=block_tables,
        layout=self._layout, num_streams=num_envs or 1,
        batched=num_envs is not None) or None

  table_names = property(lambda self: [t.name for t in self._tables],
                         doc='The tables this observer writes to.')
  num_envs = property(lambda self: self._num_envs,
                      doc='Environments per call (None: unbatched).')
  live_counters = property(
      lambda self: self._counters,
      doc='The `Counters` this observer updates (read it; do not change it).')

  num_steps = counters_lib.counter_property('steps')
  num_episodes = counters_lib.counter_property('episodes')
  items_per_table = counters_lib.counter_property('items')
  num_short_episodes = counters_lib.counter_property('short_episodes')
  num_short_episode_steps = counters_lib.counter_property('short_episode_steps')
  num_long_episodes = counters_lib.counter_property('long_episodes')
  num_dropped_episodes = counters_lib.counter_property('dropped_episodes')
  num_lost_steps = counters_lib.counter_property('lost_steps')
  num_lost_items = counters_lib.counter_property('lost_items')
  num_lost_at_restart = counters_lib.counter_property('lost_at_restart')
  num_reconnects = counters_lib.counter_property('reconnects')
  num_resent_items = counters_lib.counter_property('resent_items')

  num_items = property(lambda self: self._counters.num_items,
                       doc='Items created, over all tables.')

  # ------------------------------------------------------------------ writing

  def __call__(self, trajectory: Any) -> None:
    """Validates and appends one step (per environment); creates items.

    Args:
      trajectory: one `Trajectory` matching the data spec: unbatched, or with
        an outer dimension of `num_envs`.

    Raises:
      TrajectorySpecError: if a field's structure, dtype, shape or values are
        wrong (nothing is written).
      ManagerStateError: if the observer was closed, or is used in a forked
        process.
      WaitTimeoutError: if the server does not accept pending items within
        `timeout_s` (e.g. a rate limiter blocks inserts); the step was
        written.
      ServerUnavailableError: if the server did not answer for
        `reconnect_timeout_s`; the unconfirmed steps are counted in
        `num_lost_steps` and the next step starts a new episode.
      WriteFailedError: if the server refused the writes (e.g. it restarted
        with other tables); the loss is counted the same way.
    """
    if os.getpid() != self._pid:
      raise errors.ManagerStateError(
          f'this observer was created in process {self._pid} and is called '
          f'in process {os.getpid()}, a forked copy: a Reverb writer hangs '
          'after fork. Start actor processes with '
          "multiprocessing.get_context('spawn') and make the observer there "
          "(ReplayBufferManager(server_address=...).connect()).")
    arrays = self._validate(trajectory)
    step_types = arrays[self._step_type]
    columns = self._layout.columns(arrays)
    with self._lock:
      if self._closed:
        raise errors.ManagerStateError(
            'this observer is closed; get a new one from the manager.')
      log = self._log
      if not log:
        if self._stamp:
          self._calls += 1
          self._stamp(columns, self._writer_key, self._calls)
        self._write_call(columns, step_types)
        return
      if self._stamp:
        self._stamp(columns, self._writer_key, log.journal.next_seq)
      log.journal.check()  # A failing journal refuses before any write.
      log.begin(columns, step_types, self._counters)
      try:
        self._write_call(columns, step_types)
      finally:
        log.commit(self._counters)

  def _write_call(self, columns: List[Any], step_types: Any) -> None:
    """Writes one call's step(s) to every stream and the packed tables."""
    if self._num_envs is None:
      plan, out = self._streams[0]
      self._write(plan, out, columns, int(step_types))
    else:
      for index, (plan, out) in enumerate(self._streams):
        try:
          self._write(plan, out, [column[index] for column in columns],
                      int(step_types[index]))
        except BaseException:
          for later, _ in self._streams[index + 1:]:
            later.gap = True  # Their step of this call was never written.
          raise
    if self._blocks:
      if self._log:
        self._log.op(journaling.BLOCK_ADD)
      self._blocks.add(columns, step_types,
                       batched=self._num_envs is not None)

  def _write(self, plan: planner_lib.StreamPlan,
             out: writer_lib.StreamWriter, step: List[Any],
             step_type: int) -> None:
    """Writes one environment's step (its Reverb columns) and the items it
    completes."""
    if out.episode_open:  # An earlier end of episode timed out.
      out.finish_episode()
    if plan.starts_episode(step_type):
      plan.end_episode()
      out.end_episode()
    chunk_complete = self._writes_steps and out.append(step)
    if plan.add(step_type):  # The step is LAST.
      plan.end_episode()
      out.end_episode()
    elif chunk_complete:
      out.end_chunk()

  def end_episode(self) -> None:
    """Closes the current episode of every stream and sends pending items.

    Episode tables get the episode's items; sequence tables drop the cached
    steps, so later items never include steps from before this call (unless
    a table crosses episodes). Called automatically at every episode
    boundary.

    Raises:
      WaitTimeoutError: if the server does not accept the items in time.
      ServerUnavailableError, WriteFailedError: see `__call__`.
    """
    with self._lock:
      if self._closed:
        return
      log = self._log
      if log:
        log.journal.check()
        log.begin([], [], self._counters)
      try:
        for plan, out in self._streams:
          if plan.episode_steps:
            plan.end_episode()
            out.end_episode()
        if self._blocks:
          if log:
            log.op(journaling.BLOCK_END_EPISODE)
          self._blocks.end_episode()
      finally:
        if log:
          log.commit(self._counters)

  def count_restart_loss(self, saved_since: Optional[float],
                         restarted: Optional[float] = None) -> int:
    """Counts the confirmed items a server restart lost.

    A server restarted from a checkpoint lost the items this observer sent
    after that checkpoint's save began and saw confirmed before the new
    server started (`confirmations`); they are added to `num_lost_items` and
    `num_lost_at_restart` (a lower bound by at most the 49 items in flight
    during the save; items counted before are not counted again).

    Args:
      saved_since: when the restored checkpoint's save began (wall time), or
        None if the restarted server restored no checkpoint (everything it
        had confirmed is lost).
      restarted: when the new server started; items seen confirmed later
        reached it.

    Returns:
      The items counted as lost now.
    """
    with self._lock:
      lost = self.confirmations.lost_at_restart(saved_since, restarted)
      self._counters.lost_items += lost
      self._counters.lost_at_restart += lost
    if lost:
      logging.error(
          'The Reverb server at %s was restarted from an older checkpoint: '
          'at least %d item(s) this observer sent after that save began are '
          'lost (counted in num_lost_items).', self._client.server_address,
          lost)
    return lost

  def flush(self) -> None:
    """Blocks until every created item is stored on the server.

    Raises:
      WaitTimeoutError: if that takes longer than `timeout_s`.
      ServerUnavailableError: if the server did not answer for
        `reconnect_timeout_s` (see `__call__`).
      WriteFailedError: if the server refused the writes (see `__call__`).
    """
    with self._lock:
      if self._closed:
        return
      for _, out in self._streams:
        out.flush()
      if self._blocks:
        self._blocks.flush()
      if self._log:  # A flush completes packed blocks early: replayed too.
        self._log.flushed()
        self._log.journal.flush()  # To the OS; 'always': on disk.

  def close(self) -> None:
    """Flushes and closes the writers; safe to call more than once.

    Steps of an unfinished episode that do not yet form an item are dropped
    (episode tables get no item for an unfinished episode).

    Raises:
      WaitTimeoutError: if the flush times out (the writers are closed
        anyway).
      ServerUnavailableError, WriteFailedError: see `__call__` (the writers
        are closed anyway).
    """
    with self._lock:
      if self._closed:
        return
      try:
        self.flush()
      finally:
        self._closed = True
        for plan, out in self._streams:
          out.close()
          plan.restart()
        if self._blocks:
          self._blocks.close()
        if self._log:
          self._log.journal.close()

  # ------------------------------------------------------------- journal

  journal = property(
      lambda self: self._log.journal if self._log else None,
      doc='The write-ahead journal of this observer (`JournalWriter`), or '
      'None.')

  def journal_marks(self) -> Optional[Dict[str, int]]:
    """Where a checkpoint taken now leaves this observer's journal.

    Call it after `flush()`, with the lock held, so that nothing is written
    between the two (the manager's checkpoint does).

    Returns:
      `{'mark': its last record, 'keep_from': the oldest record holding a
      step a later item may reference}`, or None without a journal.
    """
    with self._lock:
      if not self._log:
        return None
      return {'mark': self._log.journal.next_seq - 1,
              'keep_from': self._log.keep_from()}

  def journal_cleared(self) -> None:
    """Records in the journal that the tables were emptied (call after
    `end_episode()`, as the manager's `clear()` does)."""
    with self._lock:
      if self._log and not self._closed:
        self._log.cleared()

  def replay_journal(self, contents: journal_segments.JournalContents, *,
                     mark: int, keep_from: int) -> journaling.Replayed:
    """Writes another observer's journaled calls after `mark` again.

    This observer (made with no journal, the same tables, layout and
    `num_envs` as the journaled one) runs the records from `keep_from`:
    up to `mark` it only appends their steps (the context later items
    reference), after it everything; then it flushes. Its counters count
    what the replayed records had counted.

    Args:
      contents: the journal, read (`storage.journal_segments.read`).
      mark: the last record the restored checkpoint holds.
      keep_from: the first record replay needs.

    Returns:
      What was replayed (`journaling.Replayed`).

    Raises:
      ValueError: if the journal was written by an observer of other
        tables, columns or `num_envs`; names the difference.
      WaitTimeoutError, ServerUnavailableError, WriteFailedError: see
        `__call__`.
    """
    meta = contents.meta
    mine = {'tables': self.table_names, 'num_envs': self._num_envs}
    theirs = {'tables': meta.get('tables'), 'num_envs': meta.get('num_envs')}
    if mine != theirs:
      raise ValueError(f'the journal of writer {contents.writer_id} was '
                       f'written for {theirs}; this buffer has {mine}.')
    with self._lock:
      done = journaling.replay(
          contents, mark=mark, keep_from=keep_from,
          streams=[out for _, out in self._streams],
          blocks=self._blocks or None, tables=meta['tables'],
          batched=self._num_envs is not None)
      steps, env_steps, episodes = done.counted
      self._counters.steps += steps
      self._counters.env_steps += env_steps
      self._counters.episodes += episodes
      for table, count in done.items.items():
        self._counters.items[table] += count
    return done

  retains = property(
      lambda self: self.resender is not None,
      doc='Whether this observer keeps what it sent (in memory, or in a '
      'journal folder of its client), to send it again to a restarted '
      'server (`resender`).')

  def reset_counters(self) -> None:
    """Sets every counter of this observer back to zero."""
    with self._lock:
      self._counters.reset()

  def counters(self) -> Dict[str, Any]:
    """Returns this observer's counts: `Counters.as_dict()`."""
    return self._counters.as_dict()

  def pending_items(self) -> Dict[str, int]:
    """Returns the items written that the server does not hold yet.

    Returns:
      `{table: items}`: items in a chunk still open, or sent and not yet
      confirmed (`StreamWriter.pending_items`; never sends early). Blocks of
      packed items are sent at once: 0.
    """
    with self._lock:
      pending = dict.fromkeys(self.table_names, 0)
      for _, out in self._streams:
        for table, count in out.pending_items().items():
          pending[table] += count
      return pending


def _check_arguments(tables: Sequence[Any], *, num_envs: Optional[int],
                     priority: Optional[float]) -> None:
  """Checks a `TrajectoryObserver`'s own arguments (its option groups were
  checked when they were made).

  Raises:
    ValueError: naming the first bad argument and its value.
  """
  if not tables:
    raise ValueError(f'tables must hold at least one TableConfig, got '
                     f'{tables!r}.')
  for config in tables:
    if not isinstance(config, tables_lib.TableConfig) or (
        config.item_length is None):
      raise ValueError(f'tables entries must be resolved TableConfigs '
                       f'(TableConfig.resolve), got {config!r}.')
  step_validation.check_optional_count('num_envs', num_envs, 'unbatched')
  if priority is not None and (not isinstance(priority, (int, float)) or
                               priority <= 0):
    raise ValueError(f'priority must be None or a number > 0 (an item of '
                     f'priority 0 is never sampled), got {priority!r}.')
