"""Sends one stream of steps and its items to a Reverb server.

`StreamWriter` is the transport of one environment's stream: it appends each
step to a Reverb `TrajectoryWriter`, turns the items the planner asks for
into Reverb items, and bounds every wait on the server:

* Speed: it calls the C++ writer directly (`reverb_internal.raw_calls`),
  without the Python `TrajectoryWriter`'s history bookkeeping and item
  slicing, which cost more than Reverb's C++ itself: it keeps the cell
  references of the last steps itself, groups each column into chunks of
  `chunk_length` steps, and creates a chunk's items together, one C++ call
  each, once the chunk is complete (Reverb still validates every item against
  the table signature). Items reach the server then, at every episode end,
  and on `flush()`.
* Back-pressure: before creating a chunk's items it waits (bounded) until at
  most `_PENDING_LIMIT` items would be unconfirmed, so a writer never runs
  far ahead of a blocked server.
* Reconnects: while the server does not answer, it keeps waiting for up to
  `reconnect_timeout_s` for Reverb's writer to reconnect and send the pending
  items; then it gives the stream up, counts the steps and items never
  stored (`Counters.lost_steps`, `lost_items`), and starts over on a new
  writer.
* Confirmations: it records when its items were confirmed
  (`ConfirmationLog`), to count what a later server restart lost.
"""

import collections
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import reverb
from absl import logging

from smart_replay import _reverb_internal as reverb_internal
from smart_replay import errors
from smart_replay.writing import settings as settings_lib
from smart_replay.writing import waits

# Reverb logs "the number of pending items is alarmingly high" once 50 or more
# items of a writer are created but unconfirmed (seen at exactly 50). A stream
# creates the items of a chunk once the chunk is complete, after waiting
# (bounded) until at most this many would be pending: back-pressure that
# bounds a writer running ahead of the server, and keeps the warning quiet.
_PENDING_LIMIT = 49


class StreamWriter:
  """One environment's Reverb writer, its deferred items and their fate.

  Attributes:
    on_restart: called with no argument whenever the stream starts over on a
      new writer after it gave up, e.g. to forget the open episode.
    steps: steps written by this stream.
    chunk_steps: steps in the writer's open chunk.
    lookback: cells an item references before its first step (a frame
      stack's; else 0).

  Args:
    settings: the observer's `WriterSettings`.
  """

  def __init__(self, settings: settings_lib.WriterSettings):
    self._settings = settings
    self.on_restart = lambda: None
    self._chunk_length = settings.chunk_length
    self._squeeze = [False] * settings.num_columns
    self.history = collections.deque(maxlen=settings.keep_alive)
    # The layout's encoder of each step into Reverb steps (a frame stack's:
    # a cell of its new frames; items then reference `lookback` cells
    # before their first step).
    self._encoder = settings.encoder()
    self.lookback = settings.lookback
    # Items whose last step is in the open chunk: (table, priority, columns,
    # last step), created when the chunk is complete (see `_PENDING_LIMIT`).
    self.deferred = []
    # (last step, table, time sent) of the created items not known to be
    # confirmed, oldest first: once the server confirms all but k of them,
    # every step up to `created[-k - 1]` is stored (Reverb confirms in order,
    # except after a reconnect, where the count of lost steps is
    # approximate). Confirmed items are recorded with the time they were
    # sent and the time their confirmation was seen (see `confirmations`).
    self.created = collections.deque()
    self.confirmed_steps = 0  # Steps up to here are all stored.
    self.steps = 0  # Steps written by this stream.
    self._server_wait = waits.ServerWait(
        settings, failed=self._failed, give_up=self._give_up,
        outage=self._outage)
    self.writer = None
    self.restart()

  def restart(self) -> None:
    """Starts over on a new Reverb writer, episode and chunk; the old writer
    is closed (at once; Reverb drops its unconfirmed items)."""
    if self.writer is not None:
      self.writer.close()
    settings = self._settings
    self.writer = reverb_internal.new_trajectory_writer(
        settings.client, chunk_length=settings.chunk_length,
        keep_alive=settings.keep_alive)
    # The C++ writer's calls, without the Python wrapper's per-step history
    # bookkeeping: `history` keeps the cell references of the last steps.
    self._append, self._create_item = reverb_internal.raw_calls(self.writer)
    self._forget_cells()
    self.deferred.clear()
    self.created.clear()
    self.confirmed_steps = self.steps
    self.chunk_steps = 0  # Steps in the writer's open chunk.
    # The writer's episode still has to be ended (its end timed out).
    self.episode_open = False
    self.on_restart()

  # ------------------------------------------------------------------ writing

  def append(self, step: List[np.ndarray]) -> bool:
    """Appends one step's fields to the writer.

    Args:
      step: the step's fields, flat.

    Returns:
      Whether the writer's chunk is complete with this step (then call
      `end_chunk()` once the step's items are deferred).

    Raises:
      WriteFailedError: if the writer failed for good.
    """
    # The encoder directly, not through `encode`: a Python call costs about
    # 1% of a low-dimensional step.
    return self.append_cells(self._encoder.cells(step, first=not self.history))

  def encode(self, step: List[np.ndarray]) -> List[List[Any]]:
    """The Reverb steps of one step, as the layout's encoder makes them (a
    frame stack's goes on to the next step).

    Args:
      step: the layout's columns of the step.

    Returns:
      `[columns of a Reverb step, ...]`.
    """
    return self._encoder.cells(step, first=not self.history)

  def append_cells(self, cells: List[List[Any]]) -> bool:
    """Appends one step as Reverb steps already encoded (`encode`; a
    journal's record of them).

    Args:
      cells: `[columns of a Reverb step, ...]`.

    Returns:
      Whether the writer's chunk is complete with this step.

    Raises:
      WriteFailedError: if the writer failed for good.
    """
    for columns in cells:
      try:
        self.history.append(self._append(columns))
      except RuntimeError as e:  # The writer failed for good (see waits).
        self._failed('append', e)
      self.chunk_steps += 1
    self.steps += 1
    return self.chunk_steps >= self._chunk_length

  def defer(self, table: str, priority: float, length: int) -> None:
    """Adds the item of the last `length` steps; created with its chunk.

    Args:
      table: the item's table.
      priority: its priority.
      length: its steps, the last ones written.
    """
    history = self.history
    first = len(history) - length
    # With a frame stack, also the cells before it that hold its first stack.
    columns = [list(refs) for refs in zip(*(history[i] for i in range(
        first - self.lookback, len(history))))]
    self.deferred.append((table, priority, columns, self.steps))

  def end_chunk(self) -> None:
    """Creates the items of the complete chunk (see `append`)."""
    self.chunk_steps = 0
    self.send()

  def send(self) -> bool:
    """Creates the deferred items once they fit; True if any.

    Raises:
      WaitTimeoutError, ServerUnavailableError, WriteFailedError: see
        `waits.ServerWait`.
    """
    if not self.deferred:
      return False
    room = max(_PENDING_LIMIT - len(self.deferred), 0)
    self._server_wait('flush', lambda timeout_ms: self.writer.flush(
        block_until_num_items=room, timeout_ms=timeout_ms))
    self._record_confirmed(max(len(self.created) - room, 0))
    sent = time.time()
    for index, (table, priority, columns, last_step) in enumerate(
        self.deferred):
      try:
        self._create_item(table, priority, columns, self._squeeze)
      except RuntimeError as e:
        del self.deferred[:index]  # Those were created.
        self._failed('create_item', e)
      self.created.append((last_step, table, sent))
    self.deferred.clear()
    return True

  def pending_items(self) -> Dict[str, int]:
    """Counts the items of this stream that the server does not hold yet.

    Those waiting for their chunk to complete (Reverb knows nothing of them
    yet), and those created but not yet confirmed (asked of Reverb's writer
    waiting at most 1 ms: Reverb takes a timeout of 0 as none; nothing is
    sent early).

    Returns:
      `{table: items}`, only tables with pending items.
    """
    pending = collections.Counter(entry[0] for entry in self.deferred)
    unconfirmed = 0
    if self.created:
      try:  # Does not finalize chunks: created items' chunks are complete.
        self.writer.flush(block_until_num_items=0, timeout_ms=1)
      except reverb.errors.DeadlineExceededError as timed_out:
        counts = reverb_internal.pending_counts(timed_out)
        unconfirmed = len(self.created) if counts is None else min(
            sum(counts), len(self.created))
      except RuntimeError:  # A broken writer: nothing more is confirmed.
        unconfirmed = len(self.created)
    for index in range(len(self.created) - unconfirmed, len(self.created)):
      pending[self.created[index][1]] += 1
    return dict(pending)

  def end_episode(self) -> None:
    """Sends the episode's items and ends the writer's episode.

    Raises:
      WaitTimeoutError, ServerUnavailableError, WriteFailedError: see
        `waits.ServerWait`.
    """
    self.send()
    if self._settings.clear_at_episode_end:
      self._forget_cells()  # The writer drops these cells' references.
    self.chunk_steps = 0  # The writer closes (or drops) its open chunk.
    # Reverb ends the writer's episode only once its flush succeeds: until
    # then the next write must end it first.
    self.episode_open = True
    self.finish_episode()

  def finish_episode(self) -> None:
    """Ends the writer's episode (again, if an earlier end timed out)."""
    self._server_wait('the end of an episode',
                      lambda timeout_ms: self.writer.end_episode(
                          clear_buffers=self._settings.clear_at_episode_end,
                          timeout_ms=timeout_ms))
    self.episode_open = False
    self._confirmed()

  def flush(self) -> None:
    """Blocks until every item of the stream is stored on the server.

    Raises:
      WaitTimeoutError, ServerUnavailableError, WriteFailedError: see
        `waits.ServerWait`.
    """
    if self.send():
      self.chunk_steps = 0  # The flush closes the chunk they are in.
    self._server_wait('flush', lambda timeout_ms: self.writer.flush(
        timeout_ms=timeout_ms))
    self._confirmed()

  def close(self) -> None:
    """Closes the writer at once, dropping what it did not send."""
    self.writer.close()
    self._forget_cells()
    self.deferred.clear()
    self.steps = self.chunk_steps = 0

  def _forget_cells(self) -> None:
    """Drops the cell references; the next cell holds a whole stack."""
    self.history.clear()
    self._encoder.reset()

  def _outage(self, pending: Optional[Tuple[int, int]]) -> None:
    """The server stopped answering while `pending` = Reverb's `(unsent,
    unconfirmed)` items were not stored: every older created item was
    confirmed by the server that is gone (a restart may have lost them;
    recorded now, so if a new server has started already they count as held
    by it). The pending ones are sent again to the server that comes back,
    which holds them (unknown counts: all of them). Either way the loss stays
    a lower bound."""
    if pending is not None:
      self._record_confirmed(len(self.created) - sum(pending))

  def _record_confirmed(self, count: int) -> None:
    """The oldest `count` created items are confirmed: records them with the
    time they were sent and now (when that was seen), and the steps now
    stored."""
    log, group, group_sent = self._settings.confirmations, 0, None
    seen = time.time()
    for _ in range(min(count, len(self.created))):
      last_step, _, sent = self.created.popleft()
      self.confirmed_steps = max(self.confirmed_steps, last_step)
      if sent != group_sent and group:  # A chunk's items share one time.
        log.add(group, sent=group_sent, seen=seen)
        group = 0
      group, group_sent = group + 1, sent
    log.add(group, sent=group_sent, seen=seen)

  def _confirmed(self) -> None:
    """Records that the server confirmed every item of the stream."""
    self._record_confirmed(len(self.created))
    self.confirmed_steps = self.steps

  def _failed(self, what: str, error: Exception):
    """Gives the stream up after its writer failed for good, and raises.

    Reverb's writer retries only while the server is unavailable; any other
    error (e.g. a restarted server without the table: "Priority table ... was
    not found") breaks it permanently.

    Raises:
      WriteFailedError: always, naming the error and what was lost.
    """
    steps, items = self._give_up()
    raise errors.WriteFailedError(
        f'The Reverb server at {self._settings.client.server_address} refused '
        f'the writes of tables {self._settings.table_names} at {what}: '
        f'{error}. Was it restarted with another config? {steps} step(s) and '
        f'{items} item(s) written since the last confirmed item are lost '
        '(counted in num_lost_steps / num_lost_items); the next step starts a '
        'new episode on a new writer.') from error

  def _give_up(self):
    """Counts what the stream never got stored, then starts it over.

    Returns:
      `(lost_steps, lost_items)`.
    """
    # How many created items are still unconfirmed: the smallest k for which
    # "at most k pending" holds without waiting.
    def at_most(k):
      try:
        self.writer.flush(block_until_num_items=k, timeout_ms=1)
      except (reverb.errors.DeadlineExceededError, RuntimeError):
        return False  # More pending, or a broken writer: all unconfirmed.
      return True
    low, high = 0, len(self.created)
    while low < high:
      middle = (low + high) // 2
      if at_most(middle):
        high = middle
      else:
        low = middle + 1
    unconfirmed = low
    stored_upto = self.confirmed_steps
    if len(self.created) > unconfirmed:
      stored_upto = max(stored_upto, self.created[-unconfirmed - 1][0])
    lost_steps = self.steps - stored_upto
    lost_items = unconfirmed + len(self.deferred)
    counters = self._settings.counters
    counters.lost_steps += lost_steps
    counters.lost_items += lost_items
    logging.error('Lost %d step(s) and %d item(s) that the server never '
                  'confirmed.', lost_steps, lost_items)
    self.restart()  # Closes the old one at once, dropping its items.
    return lost_steps, lost_items

