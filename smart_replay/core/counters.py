"""The counts an observer keeps of what it wrote and what it lost.

`Counters` lists every count once: the observer's planner and writers update
its fields in place, `reset()` zeroes them, `as_dict()` is what
`TrajectoryObserver.counters()` returns, and `Counters.total(...)` sums the
counters of several observers (e.g. for a manager's `stats()`).
"""

import dataclasses
from typing import Any, Dict, Iterable, Sequence


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
