"""The checks of a `TrajectoryObserver`'s arguments, naming the bad value."""

from typing import Any, Optional, Sequence

from smart_replay.config import tables as tables_lib
from smart_replay.spec import validation as step_validation
from smart_replay.utils import checks


def check_observer_arguments(tables: Sequence[Any], *,
                             num_envs: Optional[int],
                             priority: Optional[float], timeout_s: float,
                             reconnect_timeout_s: float,
                             chunk_length: Optional[int]) -> None:
  """Checks the arguments of a `TrajectoryObserver` (see there).

  Args:
    tables: resolved `TableConfig`s, at least one.
    num_envs: None or an integer >= 1.
    priority: None or a number > 0.
    timeout_s: a positive number.
    reconnect_timeout_s: a positive number.
    chunk_length: None or an integer >= 1.

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
  checks.positive('timeout_s', timeout_s)
  checks.positive('reconnect_timeout_s', reconnect_timeout_s)
  step_validation.check_optional_count('chunk_length', chunk_length,
                                       'automatic')
