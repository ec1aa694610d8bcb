"""Which items each step of a trajectory completes, per table.

The item planner knows nothing about Reverb: it is told every step type of
one environment's stream and answers by calling `emit(table, priority,
length)` for each item that step completes, an item being the last `length`
steps of the stream, up to and including this one. It decides

* sequence items: `sequence_length` consecutive steps every `stride_length`
  steps of an episode (or of the whole stream, for a table that sets
  `cross_episodes`);
* episode items: one per episode, or per piece of `episode_length` steps of a
  longer one (`long_episodes`: 'split' into pieces, 'truncate' to the first
  one, or 'drop' the whole episode);
* episode boundaries: a LAST step ends the episode, and a FIRST step (or a
  lost step) in the middle of one ends it before that step;
* their priorities: a fixed one, or `priority_fn(table)` per item;

and counts steps, episodes, items, and short, long and dropped episodes in a
`Counters`. With `num_envs` environments, each has its own `StreamPlan`.
"""

from typing import Callable, Optional, Sequence

from tf_agents.trajectories import time_step as ts

from smart_replay.config import tables as tables_lib
from smart_replay.writing import counters as counters_lib

FIRST = int(ts.StepType.FIRST)
LAST = int(ts.StepType.LAST)

# emit(table name, priority, length): the item of the stream's last `length`
# steps.
Emit = Callable[[str, float, int], None]


class ItemPlanner:
  """What every stream of one observer shares: its tables and priorities.

  Args:
    tables: the resolved configs of the tables written (see
      `TableConfig.resolve`).
    counters: the `Counters` to count steps, episodes and items in.
    priority: priority of every new item; None uses each table's
      `initial_priority`, or `priority_fn` for a prioritized table without
      one (else 1.0).
    priority_fn: `fn(table_name) -> float`, the priority of a new item of a
      prioritized table when neither `priority` nor the table's
      `initial_priority` is set.
  """

  def __init__(self, tables: Sequence[tables_lib.TableConfig], *,
               counters: counters_lib.Counters,
               priority: Optional[float] = None,
               priority_fn: Optional[Callable[[str], float]] = None):
    self.counters = counters
    self.sequence_tables = [t for t in tables if t.kind == 'sequence']
    self.episode_tables = [t for t in tables if t.kind == 'episode']
    # Whether a stream forgets its steps at each episode end (no table
    # crosses episodes).
    self.clear_at_episode_end = not any(t.cross_episodes for t in tables)
    self.shortest_sequence = min(
        (t.sequence_length for t in self.sequence_tables), default=None)
    # Per table: a fixed priority, or None to ask priority_fn per item.
    self.fixed_priority = {}
    for config in tables:
      fixed = priority if priority is not None else config.initial_priority
      if fixed is None and (priority_fn is None or not config.prioritized):
        fixed = 1.0
      self.fixed_priority[config.name] = None if fixed is None else float(
          fixed)
    self.priority_fn = priority_fn

  def stream(self, emit: Emit) -> 'StreamPlan':
    """A new stream (one environment), planning into `emit`.

    Args:
      emit: called as `emit(table, priority, length)` for every item a step
        completes: the stream's last `length` steps.

    Returns:
      The stream's `StreamPlan`.
    """
    return StreamPlan(self, emit)


class StreamPlan:
  """The items and episodes of one environment's stream of steps.

  For each step: `starts_episode(step_type)` says whether the open episode
  must be ended (`end_episode()`) before the step; `add(step_type)` plans
  the step and says whether it ended its episode (then call
  `end_episode()`).

  Attributes:
    total_steps: steps of this stream since it was made.
    episode_steps: steps of its open episode.
    gap: a step of this stream was lost (set by the caller, e.g. when an
      earlier environment's write failed in the same batched call): the
      next step must not continue the open episode.

  Args:
    planner: the `ItemPlanner` of the observer.
    emit: see `ItemPlanner.stream`.
  """

  def __init__(self, planner: ItemPlanner, emit: Emit):
    self._planner = planner
    self._counters = planner.counters
    self._emit = emit
    self._sequence_tables = planner.sequence_tables
    self._episode_tables = planner.episode_tables
    self._fixed_priority = planner.fixed_priority
    self.total_steps = 0
    self.piece_steps = {t.name: 0 for t in planner.episode_tables}
    self.skipping = {t.name: False for t in planner.episode_tables}
    self.restart()

  def restart(self) -> None:
    """Forgets the open episode and every earlier step (a new writer)."""
    self.episode_steps = 0
    # Steps since the stream last forgot its steps: those an item crossing
    # episodes may span.
    self.window_steps = 0
    # Episode tables: steps of the current piece, and whether the rest of
    # the episode is skipped ('truncate' after the first piece, 'drop' once
    # too long).
    for name in self.piece_steps:
      self.piece_steps[name] = 0
      self.skipping[name] = False
    self.gap = False

  def starts_episode(self, step_type: int) -> bool:
    """Whether the open episode must end before a step of `step_type`.

    Args:
      step_type: the step's `step_type`.

    Returns:
      True for a FIRST step, or any step after a `gap`, in the middle of an
      episode (an environment reset, or a lost step: the two pieces are
      never joined).
    """
    return bool(self.episode_steps) and (self.gap or step_type == FIRST)

  def add(self, step_type: int) -> bool:
    """Plans one step: emits the items it completes.

    Args:
      step_type: the step's `step_type`.

    Returns:
      Whether the step is LAST: its episode ends, and the caller must call
      `end_episode()`.
    """
    self.gap = False
    self.episode_steps += 1
    self.window_steps += 1
    self.total_steps += 1
    self._counters.steps += 1
    if step_type != LAST:  # A boundary is no environment transition.
      self._counters.env_steps += 1
    for config in self._sequence_tables:
      if config.cross_episodes:
        available, position = self.window_steps, self.total_steps
      else:
        available = position = self.episode_steps
      if (available >= config.sequence_length and
          (position - config.sequence_length) % config.stride_length == 0):
        self._item(config.name, config.sequence_length)
    for config in self._episode_tables:
      name = config.name
      if self.skipping[name]:
        continue
      self.piece_steps[name] += 1
      if self.piece_steps[name] < config.episode_length:
        continue
      if config.long_episodes == 'drop':
        if self.piece_steps[name] > config.episode_length:
          self.skipping[name] = True  # Too long: no item at all.
        continue
      self._item(name, config.episode_length)
      self.piece_steps[name] = 0
      self.skipping[name] = config.long_episodes == 'truncate'
    if step_type == LAST:
      self._counters.episodes += 1
      return True
    return False

  def end_episode(self) -> None:
    """Closes the open episode: emits the episode tables' last items.

    Counts an episode too short for the shortest sequence table, and one too
    long for an episode table (and dropped, with `long_episodes='drop'`).
    """
    steps = self.episode_steps
    counters = self._counters
    for config in self._episode_tables:
      name = config.name
      piece = self.piece_steps[name]
      if steps > config.episode_length:
        counters.long_episodes[name] += 1
      if config.long_episodes == 'drop' and self.skipping[name]:
        counters.dropped_episodes[name] += 1
      elif piece and not self.skipping[name]:
        self._item(name, piece)
      self.piece_steps[name] = 0
      self.skipping[name] = False
    shortest = self._planner.shortest_sequence
    if shortest is not None and 0 < steps < shortest:
      counters.short_episodes += 1
      counters.short_episode_steps += steps
    self.episode_steps = 0
    if self._planner.clear_at_episode_end:
      self.window_steps = 0

  def _item(self, table: str, length: int) -> None:
    """Emits the item of the last `length` steps of `table`, and counts it."""
    priority = self._fixed_priority[table]
    if priority is None:
      priority = float(self._planner.priority_fn(table))
    self._emit(table, priority, length)
    self._counters.items[table] += 1
