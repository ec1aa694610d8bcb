"""The counts of a buffer, each with one definition, and an observer's counts.

Every report of a buffer (`ReplayBufferManager.stats()` and `num_frames()`,
the populate summary, `provenance.json`, `smart-replay-inspect`) uses these
names, for these counts only:

* **env steps** (`env_steps`): environment transitions taken, episode
  boundaries (TF-Agents' LAST -> FIRST trajectories) not counted: TF-Agents'
  `EnvironmentSteps` metric, and what an `Actor`'s `steps_per_run` and a
  populate's requested steps count. A buffer's count includes those of the
  checkpoint it was loaded from.
* **episodes** (`episodes`): finished episodes, i.e. LAST steps written:
  TF-Agents' `NumberOfEpisodes`. An episode in progress is not counted.
* **item episodes** (`item_episodes`, per table): Reverb's `num_episodes`,
  the episodes the table's items come from, the one in progress included
  (so usually `episodes + 1`); None for tables of packed items.
* **items** (`items`, per table; what `num_frames()` returns): the table's
  items once this process's pending items arrive: `stored_items +
  pending_items`, at most the table's `max_size`. It does not change when a
  `flush()` or `checkpoint()` sends the pending items.
* **stored items** (`stored_items`): what the server holds now (Reverb's
  `current_size`, TF-Agents' `ReverbReplayBuffer.num_frames()`).
* **pending items** (`pending_items`): items this process's observers wrote
  that the server does not hold yet: in a chunk still open (Reverb sends an
  item once its chunk is complete, at an episode end or on `flush()`), or
  sent and not yet confirmed. Counting them never sends them early, so
  chunks keep their length.
* **items written** (`items_written`): items this process's observers
  created since they were made or reset (evicted ones included).
* **inserts** / **samples** (per table): Reverb's rate-limiter counters,
  carried over by checkpoints; `inserts - stored_items` items were evicted
  (or removed by sampling).

`Counters` below lists every count one observer keeps: the observer's
planner and writers update its fields in place, `reset()` zeroes them,
`as_dict()` is what `TrajectoryObserver.counters()` returns, and
`Counters.total(...)` sums the counters of several observers (e.g. for a
manager's `stats()`). `format_counts` renders the buffer's counts in the
words every command prints.
"""

import dataclasses
from typing import Any, Dict, Iterable, Optional, Sequence


@dataclasses.dataclass(eq=False)
class Counters:
  """What one observer wrote and lost, since it was made or last reset.

  Integer fields count over all tables; dict fields count per table name.

  Attributes:
    steps: steps written (one per environment with `num_envs`), episode
      boundaries (TF-Agents' LAST -> FIRST trajectories) included: what the
      buffer stores.
    env_steps: the steps that are not boundaries: the environment
      transitions taken, as TF-Agents' `EnvironmentSteps` metric and a
      driver's `max_steps` count them. The buffer's `env_steps`.
    episodes: episodes that ended (their boundary step was written), as
      TF-Agents' `NumberOfEpisodes` counts them. The buffer's `episodes`.
    items: items created, per table.
    short_episodes: episodes (or pieces cut by a reset) too short for the
      shortest sequence table's item.
    short_episode_steps: the steps of those episodes.
    long_episodes: episodes longer than an episode table's
      `episode_length`, per episode table.
    dropped_episodes: those of them that got no item
      (`long_episodes='drop'`), per episode table.
    lost_steps: steps written but never stored (the server stayed
      unreachable, or refused the writes).
    lost_items: items written but never stored, including
      `lost_at_restart`.
    lost_at_restart: confirmed items that a restart of the server lost.
    reconnects: times the server came back while a write waited for it.
    resent_items: items sent again to a server restarted from an older
      checkpoint (`resending.Resender.resend`).
  """
  steps: int = 0
  env_steps: int = 0
  episodes: int = 0
  items: Dict[str, int] = dataclasses.field(default_factory=dict)
  short_episodes: int = 0
  short_episode_steps: int = 0
  long_episodes: Dict[str, int] = dataclasses.field(default_factory=dict)
  dropped_episodes: Dict[str, int] = dataclasses.field(default_factory=dict)
  lost_steps: int = 0
  lost_items: int = 0
  lost_at_restart: int = 0
  reconnects: int = 0
  resent_items: int = 0

  @classmethod
  def for_tables(cls, table_names: Sequence[str],
                 episode_table_names: Sequence[str]) -> 'Counters':
    """Zero counters for an observer writing these tables.

    Args:
      table_names: every table written (keys of `items`).
      episode_table_names: the episode tables among them (keys of
        `long_episodes` and `dropped_episodes`).

    Returns:
      A `Counters` with every count 0.
    """
    return cls(items=dict.fromkeys(table_names, 0),
               long_episodes=dict.fromkeys(episode_table_names, 0),
               dropped_episodes=dict.fromkeys(episode_table_names, 0))

  @property
  def num_items(self) -> int:
    """Items created over all tables."""
    return sum(self.items.values())

  def reset(self) -> None:
    """Sets every count back to zero; the per-table dicts keep their keys."""
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if isinstance(value, dict):
        for name in value:
          value[name] = 0
      else:
        setattr(self, field.name, 0)

  def as_dict(self) -> Dict[str, Any]:
    """The counts as a dict of plain values.

    Returns:
      `{field name: count}` in field order; per-table counts are copies of
      the dicts, so later counting does not change the result.
    """
    return {field.name: _copy(getattr(self, field.name))
            for field in dataclasses.fields(self)}

  @classmethod
  def total(cls, counters: Iterable['Counters']) -> 'Counters':
    """Sums counters, e.g. of every observer of a buffer.

    Args:
      counters: any number of `Counters`.

    Returns:
      A new `Counters` holding the sums; per-table counts are summed by
      table name (a table some of them lack counts 0 there).
    """
    result = cls()
    for one in counters:
      for field in dataclasses.fields(cls):
        value = getattr(one, field.name)
        if isinstance(value, dict):
          sums = getattr(result, field.name)
          for name, count in value.items():
            sums[name] = sums.get(name, 0) + count
        else:
          setattr(result, field.name, getattr(result, field.name) + value)
    return result


def _copy(value: Any) -> Any:
  return dict(value) if isinstance(value, dict) else value


def format_counts(*, env_steps: int, episodes: int,
                  items: Optional[int] = None) -> str:
  """The buffer's counts in the words every command prints.

  Args:
    env_steps: env steps (see the module docstring).
    episodes: finished episodes.
    items: items of the (first) table, or None to leave them out.

  Returns:
    e.g. '1,152 env steps, 53 finished episodes, 1,151 items'.
  """
  text = f'{env_steps:,} env steps, {episodes:,} finished episodes'
  return text if items is None else f'{text}, {items:,} items'


def counter_property(name: str) -> property:
  """A read-only attribute of an object holding `Counters` as `_counters`.

  Args:
    name: the `Counters` field.

  Returns:
    A property reading it.
  """
  read = lambda owner: getattr(owner._counters, name)  # pylint: disable=protected-access
  return property(read, doc=f'`Counters.{name}` of this observer.')
