"""A validating trajectory observer for `tf_agents.train.Actor`.

Unlike the stock TF-Agents Reverb observers (which switch Reverb's write
validation off), this observer checks every step against the data spec before
anything reaches the writer, so a wrong dtype or shape is rejected with the
field's path instead of poisoning the table until sampling fails. Every wait on
the server (episode end, flush, close) has a timeout.
"""

import threading
from typing import Any, Optional, Sequence

import numpy as np
import reverb
import tree

from smart_replay import errors
from smart_replay import specs


def _as_array(value):
  return value.numpy() if hasattr(value, 'numpy') else np.asarray(value)


class TrajectoryObserver:
  """Writes single-environment trajectories as fixed-length Reverb items.

  An item of `sequence_length` consecutive steps is created every
  `stride_length` steps once enough steps of the current episode are cached;
  the boundary step (LAST -> FIRST) closes an episode and is the last step of
  the items that end there, so items never straddle two episodes. A FIRST step
  arriving mid-episode (the environment was reset, e.g. by a new `Actor`) also
  starts a new episode. Episodes shorter than `sequence_length` produce no
  item.

  Use it as an `Actor` observer: a callable with `flush()` and `close()`.

  Args:
    client: a `reverb.Client` of the server holding the tables.
    table_names: tables every item is written to.
    data_spec: the spec of one step (e.g. `agent.collect_data_spec`).
    sequence_length: steps per item, >= 1.
    stride_length: steps between consecutive item starts, >= 1.
    priority: initial priority of new items.
    timeout_s: how long episode ends, flushes and closes may wait for the
      server to accept pending items (> 0).
    lock: a re-entrant lock held while a step is written; the manager shares
      one with its checkpoints so a checkpoint sees whole steps only.

  Raises:
    ValueError: on a bad argument; the message names it and its value.
  """

  def __init__(self, client: reverb.Client, *, table_names: Sequence[str],
               data_spec: Any, sequence_length: int, stride_length: int = 1,
               priority: float = 1.0, timeout_s: float = 60.0,
               lock: Optional[threading.RLock] = None):
    if not table_names:
      raise ValueError(f'table_names must name at least one table, got '
                       f'{table_names!r}.')
    if not isinstance(sequence_length, int) or sequence_length < 1:
      raise ValueError(f'sequence_length must be an integer >= 1, got '
                       f'{sequence_length!r}.')
    if not isinstance(stride_length, int) or stride_length < 1:
      raise ValueError(f'stride_length must be an integer >= 1, got '
                       f'{stride_length!r}.')
    if timeout_s is None or timeout_s <= 0:
      raise ValueError(f'timeout_s must be > 0 seconds, got {timeout_s!r}.')
    specs.validate_trajectory_spec(data_spec)
    self._client = client
    self._lock = lock or threading.RLock()
    self._table_names = list(table_names)
    self._data_spec = data_spec
    self._leaves = specs.flatten_spec(data_spec)
    self._dtypes = [np.dtype(leaf.dtype) for leaf in self._leaves]
    self._sequence_length = sequence_length
    self._stride_length = stride_length
    self._priority = float(priority)
    self._timeout_ms = int(timeout_s * 1000)
    self._writer = client.trajectory_writer(
        num_keep_alive_refs=sequence_length, validate_items=True)
    self._cached_steps = 0
    self.num_steps = 0
    self.num_episodes = 0
    self.num_items = 0
    # Episodes (or fragments cut by a reset) too short to make one item.
    self.num_short_episodes = 0
    self.num_short_episode_steps = 0

  @property
  def table_names(self):
    """The tables this observer writes to."""
    return list(self._table_names)

  def _validate(self, trajectory: Any) -> None:
    """Raises TrajectorySpecError unless `trajectory` matches the data spec."""
    try:
      tree.assert_same_structure(self._data_spec, trajectory, check_types=False)
    except (ValueError, TypeError) as e:
      expected = {leaf.path for leaf in self._leaves}
      received = {'/'.join(map(str, p)) or '<root>'
                  for p, _ in tree.flatten_with_path(trajectory)}
      raise errors.TrajectorySpecError(
          'trajectory structure does not match the data spec: missing fields '
          f'{sorted(expected - received)}, unexpected fields '
          f'{sorted(received - expected)}. Nothing from this step was '
          f'written. ({e})') from None
    for leaf, dtype, value in zip(self._leaves, self._dtypes,
                                  tree.flatten(trajectory)):
      array = _as_array(value)
      shape_ok = len(array.shape) == len(leaf.shape) and all(
          want is None or want == got for want, got in zip(leaf.shape,
                                                           array.shape))
      if array.dtype != dtype or not shape_ok:
        hint = ''
        if array.shape[1:] == tuple(leaf.shape) and array.ndim:
          hint = (f' It looks batched (outer dimension {array.shape[0]}); this '
                  'observer takes one unbatched step per call.')
        raise errors.TrajectorySpecError(
            f'trajectory field {leaf.path!r}: expected dtype {leaf.dtype} '
            f'shape {tuple(leaf.shape)}, received dtype {array.dtype} shape '
            f'{tuple(array.shape)}. Nothing from this step was written; the '
            f'data already in the buffer is unchanged.{hint}')

  def __call__(self, trajectory: Any) -> None:
    """Validates and appends one step; creates items when a window is full.

    Args:
      trajectory: one unbatched `Trajectory` matching the data spec.

    Raises:
      TrajectorySpecError: if a field's structure, dtype or shape is wrong
        (nothing is written).
      ManagerStateError: if the observer was closed.
      WaitTimeoutError: if the server does not accept the episode's items
        within `timeout_s` (e.g. a rate limiter blocks inserts).
    """
    self._validate(trajectory)
    with self._lock:
      if self._writer is None:
        raise errors.ManagerStateError(
            'this observer is closed; get a new one from the manager.')
      if self._cached_steps and bool(np.asarray(trajectory.is_first())):
        self.end_episode()  # Reset mid-episode: never join the two.
      self._writer.append(trajectory)
      self._cached_steps += 1
      self.num_steps += 1
      excess = self._cached_steps - self._sequence_length
      if excess >= 0 and excess % self._stride_length == 0:
        window = tree.map_structure(
            lambda column: column[-self._sequence_length:],
            self._writer.history)
        for table in self._table_names:
          self._writer.create_item(table, self._priority, window)
          self.num_items += 1
      if bool(np.asarray(trajectory.is_boundary())):
        self.num_episodes += 1
        self.end_episode()

  def end_episode(self) -> None:
    """Sends the pending items and starts a new episode.

    Cached steps are dropped, so later items never include steps from before
    this call. Called automatically at every episode boundary.

    Raises:
      WaitTimeoutError: if the server does not accept the items in time.
    """
    with self._lock:
      if self._writer is None:
        return
      if 0 < self._cached_steps < self._sequence_length:
        self.num_short_episodes += 1
        self.num_short_episode_steps += self._cached_steps
      self._cached_steps = 0
      self._wait('the end of an episode', lambda: self._writer.end_episode(
          clear_buffers=True, timeout_ms=self._timeout_ms))

  def _wait(self, what: str, call) -> None:
    try:
      call()
    except reverb.errors.DeadlineExceededError as e:
      raise errors.WaitTimeoutError(
          f'Timed out after {self._timeout_ms / 1000:g} s at {what}, waiting '
          f'for the Reverb server at {self._client.server_address} to accept '
          f'pending items for tables {self._table_names}. A rate limiter is '
          'probably blocking inserts (e.g. samples_per_insert with nothing '
          'sampling). The steps already confirmed are stored.') from e

  def flush(self) -> None:
    """Blocks until every created item is stored on the server.

    Raises:
      WaitTimeoutError: if that takes longer than `timeout_s`.
    """
    with self._lock:
      if self._writer is not None:
        self._wait('flush', lambda: self._writer.flush(
            timeout_ms=self._timeout_ms))

  def close(self) -> None:
    """Flushes and closes the writer; safe to call more than once.

    Steps of an unfinished episode that do not yet form an item are dropped.

    Raises:
      WaitTimeoutError: if the flush times out (the writer is closed anyway).
    """
    with self._lock:
      if self._writer is None:
        return
      try:
        self.flush()
      finally:
        self._writer.close()
        self._writer = None
        self._cached_steps = 0
