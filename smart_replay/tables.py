"""Table configuration: the declarative description of one Reverb table.

`TableConfig` is what users write (in Python or gin); `make_table` turns it
into a `reverb.Table` with the signature derived from the data spec, and
`running_table_differences` checks that a running server really serves what
was asked for (Reverb silently lets a restored checkpoint's config win).
"""

import dataclasses
from typing import Any, List, Optional, Tuple

import gin
import reverb

from smart_replay import specs

SAMPLERS = ('uniform', 'prioritized', 'fifo', 'lifo')
REMOVERS = ('fifo', 'lifo', 'uniform')
DEFAULT_TABLE_NAME = 'experience'


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TableConfig:
  """How one Reverb table samples, evicts and rate-limits items.

  Attributes:
    name: table name, unique on the server.
    sampler: one of 'uniform', 'prioritized', 'fifo', 'lifo'.
    remover: which item leaves a full table: 'fifo', 'lifo' or 'uniform'.
    max_size: capacity in items; None means the manager's `capacity`.
    max_times_sampled: an item is deleted after this many samples; 0 = never.
    min_size_to_sample: sampling blocks until the table holds this many items.
    samples_per_insert: if set, a SampleToInsertRatio rate limiter keeps the
      ratio of samples to inserts at this value (needs `error_buffer`); if
      None, only `min_size_to_sample` limits sampling.
    error_buffer: allowed deviation (in samples) from `samples_per_insert`.
    priority_exponent: alpha of the 'prioritized' sampler.
  """
  name: str = DEFAULT_TABLE_NAME
  sampler: str = 'uniform'
  remover: str = 'fifo'
  max_size: Optional[int] = None
  max_times_sampled: int = 0
  min_size_to_sample: int = 1
  samples_per_insert: Optional[float] = None
  error_buffer: Optional[float] = None
  priority_exponent: float = 1.0

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f'TableConfig.name must be a non-empty string, got '
                       f'{self.name!r}.')
    if self.sampler not in SAMPLERS:
      raise ValueError(f'TableConfig({self.name!r}).sampler is {self.sampler!r};'
                       f' expected one of {SAMPLERS}.')
    if self.remover not in REMOVERS:
      raise ValueError(f'TableConfig({self.name!r}).remover is {self.remover!r};'
                       f' expected one of {REMOVERS}.')
    if self.max_size is not None and (
        not isinstance(self.max_size, int) or self.max_size < 1):
      raise ValueError(f'TableConfig({self.name!r}).max_size is '
                       f'{self.max_size!r}; expected a positive integer or None.')
    if not isinstance(self.max_times_sampled, int) or self.max_times_sampled < 0:
      raise ValueError(f'TableConfig({self.name!r}).max_times_sampled is '
                       f'{self.max_times_sampled!r}; expected an integer >= 0 '
                       '(0 = no limit).')
    if (not isinstance(self.min_size_to_sample, int) or
        self.min_size_to_sample < 1):
      raise ValueError(f'TableConfig({self.name!r}).min_size_to_sample is '
                       f'{self.min_size_to_sample!r}; expected an integer >= 1.')
    if self.samples_per_insert is not None:
      if self.samples_per_insert <= 0:
        raise ValueError(f'TableConfig({self.name!r}).samples_per_insert is '
                         f'{self.samples_per_insert!r}; expected a value > 0.')
      if self.error_buffer is None or self.error_buffer <= 0:
        raise ValueError(f'TableConfig({self.name!r}).error_buffer is '
                         f'{self.error_buffer!r}; a samples_per_insert limiter '
                         'needs an error_buffer > 0.')
    if self.priority_exponent < 0:
      raise ValueError(f'TableConfig({self.name!r}).priority_exponent is '
                       f'{self.priority_exponent!r}; expected a value >= 0.')

  def with_capacity(self, capacity: int) -> 'TableConfig':
    """Returns a copy whose `max_size` is `capacity` when it was None.

    Args:
      capacity: the manager's capacity in items.

    Returns:
      A `TableConfig` with a concrete `max_size`.
    """
    if self.max_size is not None:
      return self
    return dataclasses.replace(self, max_size=capacity)

  def to_dict(self) -> dict:
    """Returns the config as a plain dict (for manifests and comparisons)."""
    return dataclasses.asdict(self)


def _selector(kind: str, priority_exponent: float):
  if kind == 'prioritized':
    return reverb.selectors.Prioritized(priority_exponent)
  return {'uniform': reverb.selectors.Uniform,
          'fifo': reverb.selectors.Fifo,
          'lifo': reverb.selectors.Lifo}[kind]()


def _rate_limiter(config: TableConfig):
  if config.samples_per_insert is None:
    return reverb.rate_limiters.MinSize(config.min_size_to_sample)
  return reverb.rate_limiters.SampleToInsertRatio(
      samples_per_insert=config.samples_per_insert,
      min_size_to_sample=config.min_size_to_sample,
      error_buffer=config.error_buffer)


def make_table(config: TableConfig, signature: Any) -> reverb.Table:
  """Builds the `reverb.Table` described by `config`.

  Args:
    config: the table's configuration; `max_size` must be set (see
      `TableConfig.with_capacity`).
    signature: the table signature, from `specs.table_signature`.

  Returns:
    A `reverb.Table`.

  Raises:
    ValueError: if `config.max_size` is None.
  """
  if config.max_size is None:
    raise ValueError(f'TableConfig({config.name!r}).max_size is None; call '
                     'with_capacity(capacity) first.')
  return reverb.Table(
      name=config.name,
      sampler=_selector(config.sampler, config.priority_exponent),
      remover=_selector(config.remover, config.priority_exponent),
      max_size=config.max_size,
      rate_limiter=_rate_limiter(config),
      max_times_sampled=config.max_times_sampled,
      signature=signature)


def diff_table_configs(stored: List[dict], requested: List[dict]
                       ) -> List[Tuple[str, Any, Any]]:
  """Compares two lists of `TableConfig.to_dict()` entries by table name.

  Args:
    stored: the table configs recorded in a checkpoint manifest.
    requested: the table configs asked for now.

  Returns:
    `(field, stored_value, requested_value)` for every differing field, e.g.
    `('tables/experience/max_size', 50000, 1000)`; a table present on one side
    only is reported as `('tables/<name>', '<missing>' | 'present', ...)`.
  """
  old = {t['name']: t for t in stored}
  new = {t['name']: t for t in requested}
  diffs = []
  for name in list(old) + [n for n in new if n not in old]:
    if name not in new:
      diffs.append((f'tables/{name}', 'present', '<missing>'))
    elif name not in old:
      diffs.append((f'tables/{name}', '<missing>', 'present'))
    else:
      for key in sorted(set(old[name]) | set(new[name])):
        if old[name].get(key) != new[name].get(key):
          diffs.append((f'tables/{name}/{key}', old[name].get(key),
                        new[name].get(key)))
  return diffs


def running_table_differences(table: reverb.Table,
                              info: reverb.reverb_types.TableInfo
                              ) -> List[Tuple[str, Any, Any]]:
  """Compares a requested table with what a running server reports.

  Args:
    table: the `reverb.Table` that was passed to the server.
    info: the server's `TableInfo` for the same name (from `server_info()`).

  Returns:
    `(field, running_value, requested_value)` per difference in sampler,
    remover, max_size, max_times_sampled, rate limiter or signature.
  """
  want = table.info
  diffs = []
  def check(field, running, requested):
    if running != requested:
      diffs.append((f'tables/{want.name}/{field}', running, requested))
  check('sampler', str(info.sampler_options).strip(),
        str(want.sampler_options).strip())
  check('remover', str(info.remover_options).strip(),
        str(want.remover_options).strip())
  check('max_size', info.max_size, want.max_size)
  check('max_times_sampled', info.max_times_sampled, want.max_times_sampled)
  for field in ('samples_per_insert', 'min_size_to_sample', 'min_diff',
                'max_diff'):
    check(f'rate_limiter/{field}', getattr(info.rate_limiter_info, field),
          getattr(want.rate_limiter_info, field))
  running_sig = [l.describe() for l in specs.flatten_spec(info.signature)] \
      if info.signature is not None else None
  wanted_sig = [l.describe() for l in specs.flatten_spec(want.signature)] \
      if want.signature is not None else None
  check('signature', running_sig, wanted_sig)
  return diffs
