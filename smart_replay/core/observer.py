"""A validating trajectory observer for `tf_agents.train.Actor`.

Unlike the stock TF-Agents Reverb observers (which switch Reverb's write
validation off, write one table, and cannot take a batch dimension), this
observer

* checks every step's structure, dtypes, shapes and values against the data
  spec before anything reaches a writer (`step_validation`);
* writes each step once and makes the items of every table from it: sequence
  items of each table's length and stride, and whole-episode items;
* takes steps of one environment, or of `num_envs` environments batched on
  the outer dimension (`BatchedPyEnvironment`, `ParallelPyEnvironment`), and
  then keeps one stream, with its own episode boundaries, per environment;
* bounds every wait on the server (episode end, flush, close) by a timeout,
  and never runs more than ~50 items ahead of the server (back-pressure), so
  a blocked table stops the actor within a timeout instead of filling its
  memory, and Reverb's "pending items alarmingly high" warning stays quiet;
* survives a restart of a remote server: while the server does not answer it
  waits, for at most `reconnect_timeout_s`, for Reverb's writer to reconnect
  and send the pending items; after that it raises `ServerUnavailableError`
  and counts the steps and items it could not store (`num_lost_steps`,
  `num_lost_items`), so nothing it wrote is dropped silently, and the next
  step starts a new episode on a new connection (what the server stored after
  its last checkpoint is lost with the server: checkpoint often enough).

Speed: the stock observers go through the Python layer of Reverb's
`TrajectoryWriter` (its history bookkeeping and item slicing cost more than
Reverb's C++ itself) and let Reverb auto-tune chunks of at most
`sequence_length + 1` steps per column. This observer keeps its own history of
the C++ writer's cell references, groups each column into chunks of
`chunk_length` steps, and creates a chunk's items together, one C++ call each,
once the chunk is complete (Reverb still validates every item against the
table signature). Items reach the server then, at every episode end, and on
`flush()`.
"""

import collections
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import reverb
from absl import logging
from tf_agents.trajectories import time_step as ts

from smart_replay import _reverb_internal as reverb_internal
from smart_replay.core import confirmations as confirmations_lib
from smart_replay import errors
from smart_replay.core import specs
from smart_replay.core import validation as step_validation
from smart_replay.core import tables as tables_lib


# Largest chunk the automatic `chunk_length` makes, in steps and in bytes of
# one column. Longer chunks write and checkpoint faster, but every sampled item
# ships and decompresses the whole chunks it references.
MAX_AUTO_CHUNK_LENGTH = 32
AUTO_CHUNK_BYTES = 32 * 1024
_FIRST = int(ts.StepType.FIRST)
_LAST = int(ts.StepType.LAST)
# Reverb logs "the number of pending items is alarmingly high" once 50 or more
# items of a writer are created but unconfirmed (seen at exactly 50). A stream
# creates the items of a chunk once the chunk is complete, after waiting
# (bounded) until at most this many would be pending: back-pressure that
# bounds a writer running ahead of the server, and keeps the warning quiet.
_PENDING_LIMIT = 49
# Longest single wait while the server does not answer (the writer retries on
# its own meanwhile; each wait ends with a check whether the server is back).
_MAX_RETRY_WAIT_S = 5.0


def auto_chunk_length(data_spec: Any) -> int:
  """The default `chunk_length` for steps of `data_spec`.

  Args:
    data_spec: the spec of one step.

  Returns:
    `MAX_AUTO_CHUNK_LENGTH` steps, fewer when the largest field is so big
    that a chunk of it would exceed `AUTO_CHUNK_BYTES` (at least 1).
  """
  largest = max(np.dtype(leaf.dtype).itemsize * int(np.prod(
      [d or 1 for d in leaf.shape])) for leaf in specs.flatten_spec(data_spec))
  return max(1, min(MAX_AUTO_CHUNK_LENGTH, AUTO_CHUNK_BYTES // max(largest, 1)))


class _Stream:
  """One environment's writer and the per-table progress of its episode."""

  def __init__(self, make_writer: Callable[[], reverb.TrajectoryWriter],
               table_names, keep_alive: int):
    self._make_writer = make_writer
    self.history = collections.deque(maxlen=keep_alive)
    # Items whose last step is in the open chunk: (table, priority, columns,
    # last step), created when the chunk is complete (see `_PENDING_LIMIT`).
    self.deferred = []
    # Last steps of the created items not known to be confirmed, oldest
    # first: once the server confirms all but k of them, every step up to
    # `created[-k - 1]` is stored (Reverb confirms in order, except after a
    # reconnect, where the count of lost steps is approximate).
    self.created = collections.deque()
    self.confirmed_steps = 0  # Steps up to here are all stored.
    self.total_steps = 0  # Steps written by this stream (stride alignment).
    self.piece_steps = dict.fromkeys(table_names, 0)
    self.skipping = dict.fromkeys(table_names, False)
    self.writer = None
    self.new_writer()

  def new_writer(self) -> None:
    """Starts over on a new Reverb writer, episode and chunk; the old writer
    is closed (at once; Reverb drops its unconfirmed items)."""
    if self.writer is not None:
      self.writer.close()
    self.writer = self._make_writer()
    # The C++ writer's calls, without the Python wrapper's per-step history
    # bookkeeping: `history` keeps the cell references of the last steps.
    self.append, self.create_item = reverb_internal.raw_calls(self.writer)
    self.history.clear()
    self.deferred.clear()
    self.created.clear()
    self.confirmed_steps = self.total_steps
    self.chunk_steps = 0  # Steps in the writer's open chunk.
    self.episode_steps = 0  # Steps of the current episode in the writer.
    # The writer's episode still has to be ended (its end timed out).
    self.writer_episode_open = False
    # Episode tables: steps of the current piece, and whether the rest of the
    # episode is skipped ('truncate' after the first piece, 'drop' once too
    # long).
    for name in self.piece_steps:
      self.piece_steps[name] = 0
      self.skipping[name] = False
    # A step of this stream was lost (an earlier environment's write failed
    # in the same batched call): the next step must not continue the episode.
    self.gap = False


class TrajectoryObserver:
  """Writes trajectories as the items of every configured table.

  Sequence tables get an item of `sequence_length` consecutive steps every
  `stride_length` steps; unless the table sets `cross_episodes`, items never
  straddle two episodes: the boundary step (LAST -> FIRST) closes an episode
  and is the last step of the items ending there, and a FIRST step arriving
  mid-episode (the environment was reset, e.g. by a new `Actor`) also starts a
  new episode. Episodes shorter than a sequence table's length give it no
  item (counted in `num_short_episodes`). Episode tables get one item per
  episode (see `TableConfig` for episodes longer than `episode_length`).

  Use it as an `Actor` observer: a callable with `flush()` and `close()`.

  Attributes:
    chunk_length: the steps per Reverb chunk it writes.
    num_steps, num_episodes, num_items, items_per_table: what it wrote.
    num_lost_steps, num_lost_items: steps and items that were written but
      never stored because the server stayed unreachable longer than
      `reconnect_timeout_s` (each such loss also raised
      `ServerUnavailableError`).
    num_reconnects: times the server came back while a write waited for it.
    num_lost_at_restart: items the server had confirmed that a restart of it
      lost (part of `num_lost_items`; see `count_restart_loss`).
    confirmations: when this observer's items were confirmed
      (`ConfirmationLog`).

  Args:
    client: a `reverb.Client` of the server holding the tables.
    tables: the resolved configs of the tables to write (see
      `TableConfig.resolve`).
    data_spec: the spec of one step (e.g. `agent.collect_data_spec`).
    num_envs: None for unbatched steps; otherwise every call takes a batch of
      this many environments' steps (outer dimension), written as
      `num_envs` independent streams.
    priority: initial priority of every new item; None uses each table's
      `initial_priority`, or `priority_fn` for tables without one.
    priority_fn: `fn(table_name) -> float` giving the priority of a new item
      of a prioritized table when neither `priority` nor the table's
      `initial_priority` is set (the manager passes the table's current
      maximum priority); otherwise items get 1.0.
    timeout_s: how long episode ends, flushes and closes may wait for the
      server to accept pending items (> 0).
    chunk_length: steps per Reverb chunk of each field (>= 1); None picks
      `auto_chunk_length(data_spec)`. Items are sent when their chunk is
      complete, at each episode end, and on `flush()`.
    lock: a re-entrant lock held while a step is written; the manager shares
      one with its checkpoints so a checkpoint sees whole steps only.
    reconnect_timeout_s: how long a write keeps waiting while the server does
      not answer (e.g. it is restarting; Reverb's writer reconnects and sends
      the pending items on its own) before the observer gives up (> 0).
    non_finite: what a step holding NaN or +-Inf in a floating field (reward,
      observation, ...) gets: 'error' (the default) refuses the step with
      `TrajectorySpecError`; 'warn' writes it and logs a warning, once per
      field; 'allow' writes it silently (for data where Inf or NaN is
      meaningful, e.g. "no reading").
    float_bounds: what a finite value of a floating field outside its
      `BoundedTensorSpec`/`BoundedArraySpec` bounds gets: 'error', 'warn' (the
      default: specs of continuous observations are often loose, so the value
      is written and a warning logged once per field) or 'allow'.
    on_reconnect: called as `on_reconnect(observer)` after a write waited
      for the server and it answered again (the client-mode manager checks
      whether the server was restarted and calls `count_restart_loss`).

  Step types (FIRST=0, MID=1, LAST=2 only, in `step_type` and
  `next_step_type`) and integer fields outside their bounds are always
  refused: the observer ends episodes by the former, and an integer action
  outside its bounds cannot be a valid action.

  Raises:
    ValueError: on a bad argument; the message names it and its value.
  """

  def __init__(self, client: reverb.Client, *,
               tables: Sequence[tables_lib.TableConfig], data_spec: Any,
               num_envs: Optional[int] = None, priority: Optional[float] = None,
               priority_fn: Optional[Callable[[str], float]] = None,
               timeout_s: float = 60.0,
               chunk_length: Optional[int] = None,
               lock: Optional[threading.RLock] = None,
               reconnect_timeout_s: float = 300.0,
               non_finite: str = 'error',
               float_bounds: str = 'warn',
               on_reconnect: Optional[
                   Callable[['TrajectoryObserver'], None]] = None):
    if not tables:
      raise ValueError(f'tables must hold at least one TableConfig, got '
                       f'{tables!r}.')
    for config in tables:
      if not isinstance(config, tables_lib.TableConfig) or (
          config.item_length is None):
        raise ValueError(f'tables entries must be resolved TableConfigs '
                         f'(TableConfig.resolve), got {config!r}.')
    if num_envs is not None and (isinstance(num_envs, bool) or
                                 not isinstance(num_envs, int) or num_envs < 1):
      raise ValueError(f'num_envs must be None (unbatched) or an integer >= 1, '
                       f'got {num_envs!r}.')
    if priority is not None and (not isinstance(priority, (int, float)) or
                                 priority <= 0):
      raise ValueError(f'priority must be None or a number > 0 (an item of '
                       f'priority 0 is never sampled), got {priority!r}.')
    for name, value in (('timeout_s', timeout_s),
                        ('reconnect_timeout_s', reconnect_timeout_s)):
      if (isinstance(value, bool) or not isinstance(value, (int, float)) or
          value <= 0):
        raise ValueError(f'{name} must be > 0 seconds, got {value!r}.')
    if chunk_length is not None and (
        isinstance(chunk_length, bool) or not isinstance(chunk_length, int) or
        chunk_length < 1):
      raise ValueError(f'chunk_length must be None (automatic) or an integer '
                       f'>= 1, got {chunk_length!r}.')
    # Raises on a bad non_finite, float_bounds or data_spec. Kept as the bound
    # `__call__`, called on every step: as fast as a method of the observer
    # (calling the instance itself adds ~50 ns a call in CPython 3.11).
    self._validate = step_validation.StepValidator(
        data_spec, num_envs=num_envs, non_finite=non_finite,
        float_bounds=float_bounds).__call__
    self._client = client
    self._pid = os.getpid()
    self._lock = lock or threading.RLock()
    self._tables = list(tables)
    self._sequence_tables = [t for t in self._tables if t.kind == 'sequence']
    self._episode_tables = [t for t in self._tables if t.kind == 'episode']
    self._clear_at_episode_end = not any(t.cross_episodes for t in self._tables)
    paths = [leaf.path for leaf in specs.flatten_spec(data_spec)]
    self._step_type = paths.index('step_type')
    self._squeeze = [False] * len(paths)
    self._num_envs = num_envs
    # Per table: a fixed priority, or None to ask priority_fn per item.
    self._fixed_priority = {}
    for config in self._tables:
      fixed = priority if priority is not None else config.initial_priority
      if fixed is None and (priority_fn is None or not config.prioritized):
        fixed = 1.0
      self._fixed_priority[config.name] = None if fixed is None else float(
          fixed)
    self._priority_fn = priority_fn
    # What each table's items look like, to check a server that came back.
    self._signatures = {
        t.name: specs.describe_signature(tables_lib.signature(t, data_spec))
        for t in self._tables}
    self._shortest_sequence = min(
        (t.sequence_length for t in self._sequence_tables), default=None)
    self._timeout_ms = int(timeout_s * 1000)
    self._reconnect_timeout_s = float(reconnect_timeout_s)
    self.chunk_length = chunk_length or auto_chunk_length(data_spec)
    # An item is created up to chunk_length - 1 steps after its last step.
    self._keep_alive = self.chunk_length + max(
        t.item_length for t in self._tables)
    if self._keep_alive > tables_lib.REVERB_MAX_INT:
      raise ValueError(
          f'chunk_length ({self.chunk_length}) + the longest item '
          f'({self._keep_alive - self.chunk_length} steps) is '
          f'{self._keep_alive} steps for Reverb\'s writer to keep; Reverb '
          f'0.14 takes at most {tables_lib.REVERB_MAX_INT} (2**31 - 1, a C++ '
          'int32).')
    def make_writer():
      return reverb_internal.new_trajectory_writer(
          client, chunk_length=self.chunk_length, keep_alive=self._keep_alive)
    self._streams = [
        _Stream(make_writer, [t.name for t in self._episode_tables],
                self._keep_alive)
        for _ in range(num_envs or 1)]
    self._closed = False
    self.num_steps = 0
    self.num_episodes = 0
    self.num_items = 0
    self.items_per_table = {t.name: 0 for t in self._tables}
    # Episodes (or fragments cut by a reset) too short for the shortest
    # sequence table's item.
    self.num_short_episodes = 0
    self.num_short_episode_steps = 0
    # Episodes longer than an episode table's episode_length, per table.
    self.num_long_episodes = {t.name: 0 for t in self._episode_tables}
    self.num_dropped_episodes = {t.name: 0 for t in self._episode_tables}
    self.num_lost_steps = self.num_lost_items = self.num_reconnects = 0
    self.num_lost_at_restart = 0
    # When this observer's items were confirmed (to count what a server
    # restart lost), and until when such losses are counted already.
    self.confirmations = confirmations_lib.ConfirmationLog()
    self._restart_counted_until = 0.0
    self._on_reconnect = on_reconnect

  @property
  def table_names(self) -> List[str]:
    """The tables this observer writes to."""
    return [t.name for t in self._tables]

  @property
  def num_envs(self) -> Optional[int]:
    """Environments per call (None: unbatched)."""
    return self._num_envs

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
    with self._lock:
      if self._closed:
        raise errors.ManagerStateError(
            'this observer is closed; get a new one from the manager.')
      if self._num_envs is None:
        self._write(self._streams[0], arrays)
        return
      for index, stream in enumerate(self._streams):
        try:
          self._write(stream, [array[index] for array in arrays])
        except BaseException:
          for later in self._streams[index + 1:]:
            later.gap = True  # Their step of this call was never written.
          raise

  def _create_item(self, stream: _Stream, config: tables_lib.TableConfig,
                   length: int) -> None:
    history = stream.history
    steps = [history[i] for i in range(len(history) - length, len(history))]
    priority = self._fixed_priority[config.name]
    if priority is None:
      priority = float(self._priority_fn(config.name))
    stream.deferred.append((config.name, priority,
                            [list(refs) for refs in zip(*steps)],
                            stream.total_steps))
    self.num_items += 1
    self.items_per_table[config.name] += 1

  def _send(self, stream: _Stream) -> bool:
    """Creates the stream's deferred items once they fit; True if any."""
    if not stream.deferred:
      return False
    room = max(_PENDING_LIMIT - len(stream.deferred), 0)
    self._wait(stream, 'flush', lambda timeout_ms: stream.writer.flush(
        block_until_num_items=room, timeout_ms=timeout_ms))
    confirmed = max(len(stream.created) - room, 0)
    while len(stream.created) > room:  # Those are confirmed now.
      stream.confirmed_steps = max(stream.confirmed_steps,
                                   stream.created.popleft())
    self.confirmations.add(confirmed)
    for index, (table, priority, columns, last_step) in enumerate(
        stream.deferred):
      try:
        stream.create_item(table, priority, columns, self._squeeze)
      except RuntimeError as e:
        del stream.deferred[:index]  # Those were created.
        self._failed(stream, 'create_item', e)
      stream.created.append(last_step)
    stream.deferred.clear()
    return True

  def _write(self, stream: _Stream, step: List[np.ndarray]) -> None:
    if stream.writer_episode_open:  # An earlier end of episode timed out.
      self._end_writer_episode(stream)
    step_type = int(step[self._step_type])
    if stream.episode_steps and (stream.gap or step_type == _FIRST):
      # Reset mid-episode, or a lost step: never join the two pieces.
      self._end_episode(stream)
    stream.gap = False
    try:
      stream.history.append(stream.append(step))
    except RuntimeError as e:  # The writer failed for good (see _wait).
      self._failed(stream, 'append', e)
    stream.chunk_steps += 1
    stream.episode_steps += 1
    stream.total_steps += 1
    self.num_steps += 1
    for config in self._sequence_tables:
      if config.cross_episodes:
        available, position = len(stream.history), stream.total_steps
      else:
        available = position = stream.episode_steps
      if (available >= config.sequence_length and
          (position - config.sequence_length) % config.stride_length == 0):
        self._create_item(stream, config, config.sequence_length)
    for config in self._episode_tables:
      if stream.skipping[config.name]:
        continue
      stream.piece_steps[config.name] += 1
      if stream.piece_steps[config.name] < config.episode_length:
        continue
      if config.long_episodes == 'drop':
        if stream.piece_steps[config.name] > config.episode_length:
          stream.skipping[config.name] = True  # Too long: no item at all.
        continue
      self._create_item(stream, config, config.episode_length)
      stream.piece_steps[config.name] = 0
      stream.skipping[config.name] = config.long_episodes == 'truncate'
    if step_type == _LAST:
      self.num_episodes += 1
      self._end_episode(stream)
    elif stream.chunk_steps == self.chunk_length:  # The chunk is complete.
      stream.chunk_steps = 0
      self._send(stream)

  def _end_episode(self, stream: _Stream) -> None:
    """Writes the episode tables' last items and closes the episode."""
    steps = stream.episode_steps
    for config in self._episode_tables:
      piece = stream.piece_steps[config.name]
      if steps > config.episode_length:
        self.num_long_episodes[config.name] += 1
      if config.long_episodes == 'drop' and stream.skipping[config.name]:
        self.num_dropped_episodes[config.name] += 1
      elif piece and not stream.skipping[config.name]:
        self._create_item(stream, config, piece)
      stream.piece_steps[config.name] = 0
      stream.skipping[config.name] = False
    if self._shortest_sequence is not None and (
        0 < steps < self._shortest_sequence):
      self.num_short_episodes += 1
      self.num_short_episode_steps += steps
    stream.episode_steps = 0
    self._send(stream)
    if self._clear_at_episode_end:
      stream.history.clear()  # The writer drops these cells' references.
    stream.chunk_steps = 0  # The writer closes (or drops) its open chunk.
    # Reverb ends the writer's episode only once its flush succeeds: until
    # then the next write must end it first.
    stream.writer_episode_open = True
    self._end_writer_episode(stream)

  def _end_writer_episode(self, stream: _Stream) -> None:
    self._wait(stream, 'the end of an episode',
               lambda timeout_ms: stream.writer.end_episode(
                   clear_buffers=self._clear_at_episode_end,
                   timeout_ms=timeout_ms))
    stream.writer_episode_open = False
    self._confirmed(stream)

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
      for stream in self._streams:
        if stream.episode_steps:
          self._end_episode(stream)

  def _confirmed(self, stream: _Stream) -> None:
    """Records that the server confirmed every item of `stream`."""
    self.confirmations.add(len(stream.created))
    stream.created.clear()
    stream.confirmed_steps = stream.total_steps

  def count_restart_loss(self, saved_since: Optional[float]) -> int:
    """Counts the confirmed items a server restart lost, after a reconnect.

    A server that was restarted from a checkpoint lost the items it had
    confirmed after that checkpoint's save began; they are added to
    `num_lost_items` and `num_lost_at_restart` (items confirmed while that
    save ran count too: an upper bound by at most those). Items counted at
    an earlier restart are not counted again.

    Args:
      saved_since: when the restored checkpoint's save began (wall time), or
        None if the restarted server restored no checkpoint (everything it
        had confirmed is lost).

    Returns:
      The items counted as lost now.
    """
    with self._lock:
      since = max(saved_since or 0.0, self._restart_counted_until)
      lost = self.confirmations.confirmed_after(since)
      self._restart_counted_until = time.time()
      self.num_lost_items += lost
      self.num_lost_at_restart += lost
    if lost:
      logging.error(
          'The Reverb server at %s was restarted from an older checkpoint: '
          '%d item(s) it had confirmed to this observer after that save began '
          'are lost (counted in num_lost_items).', self._client.server_address,
          lost)
    return lost

  def _server_holds_items(self, stream: _Stream,
                          timed_out: Exception) -> bool:
    """Whether a timed-out wait was on items the server has but holds back.

    False while the server does not answer, or while Reverb's writer has not
    sent the items yet (it is reconnecting: gRPC backs off for seconds after
    an outage). True when the server has them but does not confirm them (a
    rate limiter blocks inserts).

    Raises:
      WriteFailedError: if the server that answers serves other tables (it
        was restarted with another config); the stream is given up.
    """
    try:
      info = self._client.server_info(timeout=1)
    except (reverb.errors.DeadlineExceededError, RuntimeError):
      return False
    for name, want in self._signatures.items():
      served = info.get(name)
      got = specs.describe_signature(served and served.signature)
      if got != want:
        self._failed(stream, 'the wait for the server', RuntimeError(
            f'table {name!r} has signature {got} on the server, this '
            f'observer writes {want}'))
    counts = reverb_internal.pending_counts(timed_out)
    if counts is None:
      return True
    unsent, unconfirmed = counts
    return unconfirmed > 0 or unsent == 0

  def _attempt(self, stream: _Stream, what: str,
               call: Callable[[int], None],
               timeout_ms: int) -> Optional[Exception]:
    """Runs `call(timeout_ms)` once.

    Returns:
      None if it succeeded, its `DeadlineExceededError` if it timed out.

    Raises:
      WriteFailedError: if the writer failed for good (see `_failed`).
    """
    try:
      call(timeout_ms)
    except reverb.errors.DeadlineExceededError as e:
      return e
    except RuntimeError as e:
      self._failed(stream, what, e)
    return None

  def _wait(self, stream: _Stream, what: str,
            call: Callable[[int], None]) -> None:
    """Runs `call(timeout_ms)`, a bounded wait on the server.

    If it times out while the server does not answer, calls it again in
    growing steps for up to `reconnect_timeout_s` while Reverb's writer
    reconnects; then gives the stream up.

    Raises:
      WaitTimeoutError: the server answers but does not accept the items.
      ServerUnavailableError: the server did not come back in time.
      WriteFailedError: the writer failed for good (see `_failed`).
    """
    timed_out = self._attempt(stream, what, call, self._timeout_ms)
    if timed_out is None:
      return
    address = self._client.server_address
    if self._server_holds_items(stream, timed_out):
      raise errors.WaitTimeoutError(
          f'Timed out after {self._timeout_ms / 1000:g} s at {what}, waiting '
          f'for the Reverb server at {address} to accept '
          f'pending items for tables {self.table_names}. A rate limiter is '
          'probably blocking inserts (samples_per_insert or '
          'block_inserts_when_full with nothing sampling; see stats()'
          "['tables'][name]['rate_limiter']). The steps already confirmed are "
          'stored.') from timed_out
    began = time.monotonic()
    logging.warning(
        'The Reverb server at %s does not answer, or its writer is not '
        'reconnected yet (%s waited %g s); waiting up to %g s more '
        '(reconnect_timeout_s). The pending items are kept and sent once it '
        'is back.', address, what,
        self._timeout_ms / 1000, self._reconnect_timeout_s)
    delay = 0.25
    while True:
      left = self._reconnect_timeout_s - (time.monotonic() - began)
      if left <= 0:
        break
      late = self._attempt(stream, what, call,
                           max(1, int(min(delay, left) * 1000)))
      if late is not None:
        delay = min(2 * delay, _MAX_RETRY_WAIT_S)
        if not self._server_holds_items(stream, late):
          continue
        # Back, but the items are not accepted yet: the usual bounded wait.
        late = self._attempt(stream, what, call, self._timeout_ms)
        if late is not None:
          raise errors.WaitTimeoutError(
              f'The Reverb server at {address} came back after '
              f'{time.monotonic() - began:.1f} s, but did not accept the '
              f'pending items of tables {self.table_names} within '
              f'{self._timeout_ms / 1000:g} s at {what} (a rate limiter '
              'blocking inserts?).') from late
      self.num_reconnects += 1
      logging.warning('The Reverb server at %s answers again after %.1f s; '
                      'the pending items were sent.', address,
                      time.monotonic() - began)
      if self._on_reconnect is not None:
        self._on_reconnect(self)
      return
    steps, items = self._give_up(stream)
    raise errors.ServerUnavailableError(
        f'The Reverb server at {address} did not answer for '
        f'{self._timeout_ms / 1000 + self._reconnect_timeout_s:g} s '
        f'(write_timeout_s + reconnect_timeout_s) at {what}. {steps} step(s) '
        f'and {items} item(s) written since the last confirmed item are lost '
        f'(counted in num_lost_steps / num_lost_items; total '
        f'{self.num_lost_steps} steps). The next step starts a new episode '
        'on a new connection; restart the server (it resumes its last '
        'checkpoint) or raise reconnect_timeout_s.') from timed_out

  def _failed(self, stream: _Stream, what: str, error: Exception):
    """Gives `stream` up after its writer failed for good, and raises.

    Reverb's writer retries only while the server is unavailable; any other
    error (e.g. a restarted server without the table: "Priority table ... was
    not found") breaks it permanently.

    Raises:
      WriteFailedError: always, naming the error and what was lost.
    """
    steps, items = self._give_up(stream)
    raise errors.WriteFailedError(
        f'The Reverb server at {self._client.server_address} refused the '
        f'writes of tables {self.table_names} at {what}: {error}. Was it '
        f'restarted with another config? {steps} step(s) and {items} '
        'item(s) written since the last confirmed item are lost (counted in '
        'num_lost_steps / num_lost_items); the next step starts a new '
        'episode on a new writer.') from error

  def _give_up(self, stream: _Stream):
    """Counts what `stream` never got stored, then starts it over.

    Returns:
      `(lost_steps, lost_items)`.
    """
    # How many created items are still unconfirmed: the smallest k for which
    # "at most k pending" holds without waiting.
    def at_most(k):
      try:
        stream.writer.flush(block_until_num_items=k, timeout_ms=1)
      except (reverb.errors.DeadlineExceededError, RuntimeError):
        return False  # More pending, or a broken writer: all unconfirmed.
      return True
    low, high = 0, len(stream.created)
    while low < high:
      middle = (low + high) // 2
      if at_most(middle):
        high = middle
      else:
        low = middle + 1
    unconfirmed = low
    stored_upto = stream.confirmed_steps
    if len(stream.created) > unconfirmed:
      stored_upto = max(stored_upto, stream.created[-unconfirmed - 1])
    lost_steps = stream.total_steps - stored_upto
    lost_items = unconfirmed + len(stream.deferred)
    self.num_lost_steps += lost_steps
    self.num_lost_items += lost_items
    logging.error('Lost %d step(s) and %d item(s) that the server never '
                  'confirmed.', lost_steps, lost_items)
    stream.new_writer()  # Closes the old one at once, dropping its items.
    return lost_steps, lost_items

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
      for stream in self._streams:
        if self._send(stream):
          stream.chunk_steps = 0  # The flush closes the chunk they are in.
        self._wait(stream, 'flush',
                   lambda timeout_ms: stream.writer.flush(  # pylint: disable=cell-var-from-loop
                       timeout_ms=timeout_ms))
        self._confirmed(stream)

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
        for stream in self._streams:
          stream.writer.close()
          stream.history.clear()
          stream.deferred.clear()
          stream.episode_steps = stream.total_steps = stream.chunk_steps = 0

  def reset_counters(self) -> None:
    """Sets every counter of this observer back to zero."""
    with self._lock:
      self.num_steps = self.num_episodes = self.num_items = 0
      self.num_short_episodes = self.num_short_episode_steps = 0
      self.num_lost_steps = self.num_lost_items = self.num_reconnects = 0
      self.num_lost_at_restart = 0
      for counts in (self.items_per_table, self.num_long_episodes,
                     self.num_dropped_episodes):
        for name in counts:
          counts[name] = 0

  def counters(self) -> Dict[str, Any]:
    """Returns this observer's counts of steps, episodes and items."""
    return {'steps': self.num_steps, 'episodes': self.num_episodes,
            'items': dict(self.items_per_table),
            'short_episodes': self.num_short_episodes,
            'short_episode_steps': self.num_short_episode_steps,
            'long_episodes': dict(self.num_long_episodes),
            'dropped_episodes': dict(self.num_dropped_episodes),
            'lost_steps': self.num_lost_steps,
            'lost_items': self.num_lost_items,
            'lost_at_restart': self.num_lost_at_restart,
            'reconnects': self.num_reconnects}
