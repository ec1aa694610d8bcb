"""What `ReplayBufferManager.stats()` reports, computed from server answers.

`table_stats` reads Reverb's counters; `BlockedSince` remembers since when a
table's inserts or samples have been blocked; `report` assembles the whole
`stats()` dict from those and the observers' counters.
"""

import collections
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from smart_replay.config import limiter

# Observer counters summed over all observers, by the key `report` gives them.
OBSERVER_TOTALS = (('short_episodes', 'num_short_episodes'),
                   ('short_episode_steps', 'num_short_episode_steps'),
                   ('lost_steps', 'num_lost_steps'),
                   ('lost_items', 'num_lost_items'),
                   ('lost_at_restart', 'num_lost_at_restart'),
                   ('reconnects', 'num_reconnects'),
                   ('resent_items', 'num_resent_items'))


def table_stats(info: Mapping[str, Any],
                names: Optional[Sequence[str]] = None
                ) -> Dict[str, Dict[str, int]]:
  """Reverb's counters of each table.

  Args:
    info: a server's `server_info()` answer, `{table: TableInfo}`.
    names: the tables to report; default every table in `info`.

  Returns:
    `{table: {'items', 'max_size', 'inserts', 'samples', 'episodes',
    'unique_samples'}}`; `inserts` / `samples` are the rate limiter's
    counters.
  """
  tables = {}
  for name in (info if names is None else names):
    t = info[name]
    tables[name] = {
        'items': t.current_size,
        'max_size': t.max_size,
        'inserts': t.rate_limiter_info.insert_stats.completed,
        'samples': t.rate_limiter_info.sample_stats.completed,
        'episodes': t.num_episodes,
        'unique_samples': t.num_unique_samples,
    }
  return tables


class BlockedSince:
  """Remembers since when each table's inserts / samples have been blocked.

  Measured from the first `update` that saw them blocked.
  """

  def __init__(self):
    self._since = {}

  def update(self, table: str, state: Dict[str, Any], now: float) -> None:
    """Adds `insert_blocked_for_s` / `sample_blocked_for_s` to `state`.

    Args:
      table: the table's name.
      state: its `limiter.limiter_state` (with `can_insert`, `can_sample`);
        updated in place.
      now: `time.monotonic()` of this look.
    """
    for action in ('insert', 'sample'):
      key = (table, action)
      if state[f'can_{action}']:
        self._since.pop(key, None)
      else:
        self._since.setdefault(key, now)
      state[f'{action}_blocked_for_s'] = now - self._since.get(key, now)

  def clear(self) -> None:
    """Forgets every blocked table (after the tables were emptied)."""
    self._since.clear()


def observer_total(observers: Sequence[Any], attribute: str,
                   table: Optional[str] = None) -> int:
  """Sums one counter over observers.

  Args:
    observers: `TrajectoryObserver`s.
    attribute: the counter, e.g. 'num_lost_steps'.
    table: for per-table counters (dicts by table name), the table.

  Returns:
    The total.
  """
  values = (getattr(o, attribute) for o in observers)
  return sum(v[table] for v in values) if table is not None else sum(values)


def pending_items(observers: Sequence[Any]) -> Dict[str, int]:
  """Items the observers wrote that the server does not hold yet.

  Args:
    observers: `TrajectoryObserver`s.

  Returns:
    `{table: items}` summed over the observers (see
    `TrajectoryObserver.pending_items`).
  """
  total = collections.Counter()
  for observer in observers:
    total.update(observer.pending_items())
  return dict(total)


def items_now(stored: int, pending: int, max_size: int) -> int:
  """A table's `items`: stored plus pending, at most its `max_size`.

  Args:
    stored: the items the server holds.
    pending: this process's items not stored yet.
    max_size: the table's capacity in items (each pending item beyond it
      evicts one).

  Returns:
    `min(stored + pending, max_size)`.
  """
  return min(stored + pending, max_size)


def times_sampled_fields(per_item: Mapping[int, int]) -> Dict[str, Any]:
  """`{'times_sampled': {key: n}, 'times_sampled_histogram': {n: items}}`.

  Args:
    per_item: how often each item (by key) was sampled.

  Returns:
    The two `stats(times_sampled=True)` fields of one table.
  """
  return {'times_sampled': dict(per_item),
          'times_sampled_histogram': dict(sorted(
              collections.Counter(per_item.values()).items()))}


def report(configs: Sequence[Any], info: Mapping[str, Any], *,
           blocked: BlockedSince, observers: Sequence[Any],
           priority_of: Callable[[str], float], env_steps: int,
           episodes: int) -> Dict[str, Any]:
  """Assembles `ReplayBufferManager.stats()`.

  The result::

    {'tables': {name: {
         'kind', 'items', 'stored_items', 'pending_items', 'items_written',
         'max_size', 'inserts', 'samples', 'item_episodes',
         'unique_samples',
         'mean_times_sampled',   # samples / inserts
         'rate_limiter': {'type', 'can_insert', 'can_sample',
                          'inserts_before_blocking',
                          'insert_blocked_for_s', 'sample_blocked_for_s',
                          'insert_wait_total_s', 'sample_wait_total_s'},
         'max_priority',         # prioritized tables
         'long_episodes', 'dropped_episodes',  # episode tables
         'block_length', 'windows_per_block', 'max_windows',
         'windows_at_most',      # tables of packed items
         'times_sampled',        # {key: n}, if asked (times_sampled_fields)
         'times_sampled_histogram'}},  # {n: items}, if asked
     'env_steps', 'episodes', 'short_episodes', 'short_episode_steps',
     'lost_steps', 'lost_items', 'lost_at_restart', 'reconnects',
     'resent_items'}

  `env_steps`, `episodes`, `items`, `stored_items`, `pending_items`,
  `items_written`, `item_episodes`, `inserts` and `samples` are defined
  once, in `smart_replay.writing.counters`: `items` (what `num_frames()`
  returns) is `stored_items` (what the server holds) plus `pending_items`
  (this process's items still in an open chunk or in flight), so it does
  not change when a flush or checkpoint sends them. `env_steps` /
  `episodes` are carried over from a loaded checkpoint; in client mode,
  and for `pending_items` / `items_written`, they count this process's
  observers only. `items` is one per window (sequence tables) or episode
  (episode tables), and for tables of packed items one per block of
  `block_length` steps, holding up to `windows_per_block` windows (fewer at
  episode ends and flushes): their `max_size` is Reverb's, in blocks;
  `max_windows` is the table's configured `max_size`, in windows, and
  `windows_at_most` is `items * windows_per_block` (their `item_episodes`
  is None: one Reverb stream writes the blocks of every episode).
  `samples` counts samples a dataset prefetched.
  `*_blocked_for_s` is how long inserting / sampling has been blocked,
  measured from the first look that saw it blocked (0 when not blocked);
  `*_wait_total_s` is Reverb's total. `lost_steps` / `lost_items` count
  what observers could not store because the server stayed unreachable
  longer than `reconnect_timeout_s`, and `lost_items` also the confirmed
  items a restart of the server lost (`lost_at_restart`: confirmed after
  the restored checkpoint's save began); `short_episodes` counts episodes
  shorter than the shortest sequence item (their steps are in
  `short_episode_steps`).

  Args:
    configs: the resolved table configs.
    info: the server's `server_info()` answer.
    blocked: the manager's blocked-since record (updated).
    observers: the manager's observers.
    priority_of: the new-item priority of a prioritized table.
    env_steps: env steps written through the buffer (with carried-over ones).
    episodes: finished episodes likewise.

  Returns:
    The stats dict, without the `times_sampled` fields.
  """
  tables = table_stats(info, [c.name for c in configs])
  pending = pending_items(observers)
  now = time.monotonic()
  for config in configs:
    stats = tables[config.name]
    stats['kind'] = config.kind
    stats['item_episodes'] = stats.pop('episodes')
    stats['stored_items'] = stats['items']
    stats['pending_items'] = pending.get(config.name, 0)
    stats['items'] = items_now(stats['stored_items'], stats['pending_items'],
                               stats['max_size'])
    stats['items_written'] = sum(o.items_per_table.get(config.name, 0)
                                 for o in observers)
    stats['mean_times_sampled'] = (stats['samples'] / stats['inserts']
                                   if stats['inserts'] else 0.0)
    state = limiter.limiter_state(config, info[config.name])
    blocked.update(config.name, state, now)
    stats['rate_limiter'] = state
    if config.prioritized:
      stats['max_priority'] = priority_of(config.name)
    if config.block_length is not None:
      stats.update(item_episodes=None,  # Blocks are not per episode.
                   block_length=config.block_length,
                   windows_per_block=config.windows_per_block,
                   max_windows=config.max_size,
                   windows_at_most=stats['items'] * config.windows_per_block)
    if config.kind == 'episode':
      stats['long_episodes'] = observer_total(observers, 'num_long_episodes',
                                              config.name)
      stats['dropped_episodes'] = observer_total(
          observers, 'num_dropped_episodes', config.name)
  result = {'tables': tables, 'env_steps': env_steps, 'episodes': episodes}
  for key, attribute in OBSERVER_TOTALS:
    result[key] = observer_total(observers, attribute)
  return result


# Counters a sharded buffer's stats() sums over its shards.
SHARD_SUMS = ('items', 'stored_items', 'max_size', 'inserts', 'samples',
              'unique_samples')


def add_shards(result: Dict[str, Any], shards: Sequence[Tuple[str, Any]],
               writer: int, sampling: Optional[Sequence[Dict[str, Any]]] = None
               ) -> Dict[str, Any]:
  """Adds every shard's tables to a sharded buffer's `stats()`.

  Args:
    result: `report` of the shard this manager writes to (its observers'
      pending items included).
    shards: `(address, table_stats(...))` of every shard, in order; None
      instead of the tables of a shard that did not answer.
    writer: the index of that shard.
    sampling: per shard, what the live datasets' samplers see of it
      (`{'up', 'down_events'}`), or None.

  Returns:
    `result`, with `SHARD_SUMS` summed over the shards that answered in
    each table and `'shards'`: `[{'address', 'writer', 'up', 'tables':
    {name: table_stats}, 'sampling'}]` (`up` False and no tables for a shard
    that did not answer).
  """
  for index, (_, tables) in enumerate(shards):
    if index == writer or tables is None:
      continue
    for name, counters in tables.items():
      table = result['tables'][name]
      for field in SHARD_SUMS:
        if field == 'stored_items':
          table[field] += counters['items']
        elif field in counters and field in table:
          table[field] += counters[field]
  result['shards'] = [{'address': address, 'writer': index == writer,
                       'up': tables is not None, 'tables': tables or {},
                       'sampling': sampling[index] if sampling else None}
                      for index, (address, tables) in enumerate(shards)]
  return result
