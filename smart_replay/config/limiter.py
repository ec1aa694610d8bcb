"""Rate-limiter arithmetic of a table, with no server involved.

Reverb's rate limiters decide whether one more insert or sample may go
through from four counters (inserts, samples, size, and the limiter's
bounds). The functions here mirror those decisions so that the manager can
say *in advance* whether a prefill would block, and describe a running
table's limiter in `stats()`.
"""

import math
from typing import Any, Dict, List, Mapping, Sequence

from smart_replay import _reverb_internal as reverb_internal


def max_items(config: Any, steps: int, streams: int) -> int:
  """The most items `steps` env steps over `streams` streams can make.

  Args:
    config: a resolved `TableConfig`.
    steps: env steps written (over all streams).
    streams: environments writing them, each with its own episodes.

  Returns:
    An upper bound of the items the table receives: one per step for
    episode tables (one-step episodes, at worst); for sequence tables one
    per `min(stride_length, sequence_length)` steps, rounded up per stream.
  """
  if config.kind == 'episode':
    return steps
  # An episode of n >= L steps makes floor((n - L) / stride) + 1 items, at
  # most n / min(stride, L); each stream rounds up once.
  per = min(config.stride_length, config.sequence_length)
  return -(-steps // per) + streams - 1


def inserts_before_blocking(config: Any, *, inserts: int = 0,
                            samples: int = 0, size: int = 0) -> float:
  """How many more items can be inserted before the rate limiter blocks.

  This mirrors Reverb's `RateLimiter::CanInsert` for a table that nobody
  samples meanwhile (e.g. while a starter buffer is populated).

  Args:
    config: the table's `TableConfig`.
    inserts: inserts the limiter has counted so far.
    samples: samples it has counted so far.
    size: items in the table now.

  Returns:
    The number of further inserts that succeed with nothing sampling
    (`math.inf` for a `min_size_to_sample`-only limiter).
  """
  if config.block_inserts_when_full:  # Queue(max_size): diff <= max_size.
    return max(0.0, (config.max_size or math.inf) - (inserts - samples))
  if config.samples_per_insert is None:
    return math.inf
  spi = config.samples_per_insert
  max_diff = spi * config.min_size_to_sample + config.error_buffer
  # Free until the table holds min_size_to_sample items, then bounded by
  # (inserts + n) * spi - samples <= max_diff.
  free = max(0, config.min_size_to_sample - size)
  by_ratio = math.floor((max_diff + samples) / spi + 1e-9) - inserts
  return float(max(free, by_ratio, 0))


def limiter_type(config: Any) -> str:
  """'queue', 'samples_per_insert' or 'min_size': the limiter `config` makes.

  Args:
    config: a `TableConfig`.

  Returns:
    The limiter's type name, as `stats()` reports it.
  """
  if config.block_inserts_when_full:
    return 'queue'
  return 'min_size' if config.samples_per_insert is None else \
      'samples_per_insert'


def limiter_state(config: Any, info: Any) -> Dict[str, Any]:
  """Describes a running table's rate limiter, as Reverb would decide now.

  Mirrors Reverb's `RateLimiter::CanInsert` / `CanSample` on the counters in
  `info`.

  Args:
    config: the table's resolved config.
    info: the table's `TableInfo` from `server_info()`.

  Returns:
    `{'type', 'can_insert', 'can_sample', 'inserts_before_blocking',
    'insert_wait_total_s', 'sample_wait_total_s'}`: the limiter type
    ('min_size', 'samples_per_insert' or 'queue'), whether one more insert
    or sample would go through now, how many inserts would go through with
    nothing sampling, and the total time the table spent with blocked
    inserts / samples (Reverb's table worker times).
  """
  limiter = info.rate_limiter_info
  size = info.current_size
  can_insert, can_sample = reverb_internal.rate_limiter_allows(limiter,
                                                               size=size)
  worker = info.table_worker_time
  return {
      'type': limiter_type(config),
      'can_insert': bool(can_insert),
      'can_sample': bool(can_sample),
      'inserts_before_blocking': inserts_before_blocking(
          config, inserts=limiter.insert_stats.completed,
          samples=limiter.sample_stats.completed, size=size),
      # The table worker waits for sampling while inserts are blocked.
      'insert_wait_total_s': worker.waiting_for_sampling_ms / 1000,
      'sample_wait_total_s': worker.waiting_for_inserts_ms / 1000,
  }


def _prefill_fix(config: Any, count: Mapping[str, int], items: int) -> str:
  """How to change `config` so that `items` more inserts go through."""
  if config.block_inserts_when_full:
    return ('use block_inserts_when_full=False for a buffer filled before '
            f'training, or max_size >= {count["items"] + items}')
  # Inserts go through while inserts <= min_size + error_buffer / spi.
  total = count['inserts'] + items
  spi = config.samples_per_insert
  fix = f'raise error_buffer to >= {spi * (total - config.min_size_to_sample):g}'
  min_size = math.ceil(total - config.error_buffer / spi)
  if config.kind == 'sequence' and min_size <= config.max_size:
    fix += (f', or set min_size_to_sample >= {min_size} (a minimum '
            'size that covers the prefill: the learner starts sampling '
            'once the table holds that many items, so keep it at most '
            'the items the prefill really makes)')
  return fix + ('; train with the same table config, since a checkpoint '
                'keeps its limiter')


def prefill_problems(configs: Sequence[Any],
                     counts: Mapping[str, Mapping[str, int]], *, steps: int,
                     streams: int) -> List[str]:
  """Lists the tables whose limiter would block a prefill of `steps` steps.

  Args:
    configs: the resolved table configs.
    counts: `{table: {'inserts', 'samples', 'items'}}` now (zeros for an
      empty buffer).
    steps: env steps about to be written with nothing sampling.
    streams: environments writing them.

  Returns:
    One line per table that would block: its name, how many items the
    prefill may make, how many its limiter lets in, and how to fix the
    config. Empty when the prefill goes through.
  """
  problems = []
  for config in configs:
    count = counts[config.name]
    items = max_items(config, steps, streams)
    allowed = inserts_before_blocking(config, inserts=count['inserts'],
                                      samples=count['samples'],
                                      size=count['items'])
    if items <= allowed:
      continue
    limiter = 'queue' if config.block_inserts_when_full else \
        'samples_per_insert'
    problems.append(
        f'table {config.name!r}: up to {items} new items, but its {limiter} '
        f'rate limiter lets only {allowed:g} in while nothing samples; '
        f'{_prefill_fix(config, count, items)}.')
  return problems
