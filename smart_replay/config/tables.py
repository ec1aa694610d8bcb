"""Table configuration: the declarative description of one Reverb table.

`TableConfig` is what users write (in Python or gin): it checks itself,
resolves the manager's defaults, and is stored in and compared with
checkpoint manifests. Building the `reverb.Table` is
`smart_replay.config.reverb_tables`; the limiter arithmetic is
`smart_replay.config.limiter`.
"""

import dataclasses
from typing import Any, List, Optional, Tuple

import gin

from smart_replay import _reverb_internal as reverb_internal
from smart_replay.config import limiter

SAMPLERS = ('uniform', 'prioritized', 'fifo', 'lifo')
REMOVERS = ('fifo', 'lifo', 'uniform')
KINDS = ('sequence', 'episode')
LONG_EPISODE_POLICIES = ('split', 'truncate', 'drop')
DEFAULT_TABLE_NAME = 'experience'
# Fields that only affect sampling-side computations: a checkpoint may be
# loaded with other values (they are not compared with its manifest).
SAMPLING_ONLY_FIELDS = ('importance_beta', 'importance_beta_final',
                        'importance_beta_steps', 'priority_epsilon',
                        'initial_priority', 'windows_per_item')
# The largest count Reverb takes (max_size, max_times_sampled,
# min_size_to_sample, the writer's keep-alive steps): see _reverb_internal.
REVERB_MAX_INT = reverb_internal.MAX_INT
_TOO_LARGE = (f'at most {REVERB_MAX_INT} (2**31 - 1): Reverb 0.14 takes it as '
              'a C++ int32 and refuses larger values')


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TableConfig:
  """How one Reverb table is fed, samples, evicts and rate-limits items.

  Every table is written by the same observer, once per step; its `kind`
  decides what an item is:

  * 'sequence': `sequence_length` consecutive steps, a new item every
    `stride_length` steps. Items never straddle two episodes unless
    `cross_episodes` is True.
  * 'episode': a whole episode of up to `episode_length` steps. Shorter
    episodes are stored as they are and padded (with a mask) when sampled;
    longer ones follow `long_episodes`: 'split' into consecutive pieces of
    `episode_length` steps (the last one shorter), 'truncate' to their first
    `episode_length` steps, or 'drop' (counted in `stats()`).

  Attributes:
    name: table name, unique on the server.
    kind: 'sequence' or 'episode'.
    sampler: one of 'uniform', 'prioritized', 'fifo', 'lifo'.
    remover: which item leaves a full table: 'fifo', 'lifo' or 'uniform'.
    max_size: capacity in items; None means the manager's `capacity`.
      Reverb takes it (and `max_times_sampled`, `min_size_to_sample`,
      `sequence_length`, `episode_length`) as a C++ int32: at most
      `REVERB_MAX_INT` = 2**31 - 1.
    max_times_sampled: an item is deleted after this many samples; 0 = never
      (1 with a 'fifo' sampler is a queue: each item is sampled once).
    min_size_to_sample: sampling blocks until the table holds this many items.
    samples_per_insert: if set, a SampleToInsertRatio rate limiter keeps the
      ratio of samples to inserts at this value (needs `error_buffer`); if
      None, only `min_size_to_sample` limits sampling.
    error_buffer: allowed deviation (in samples) from `samples_per_insert`;
      at least max(1, samples_per_insert).
    block_inserts_when_full: instead of evicting unsampled items, inserts
      wait until sampling made room (Reverb's Queue limiter; needs
      `max_times_sampled=1` and no `samples_per_insert`).
    priority_exponent: alpha of the 'prioritized' sampler (>= 0; 0 is
      uniform).
    initial_priority: priority of new items; None means the largest priority
      given so far by `update_priorities` (at least 1.0), so new items are
      sampled soon.
    priority_epsilon: added to `|priority|` by `update_priorities`, so no
      item's priority is zero.
    importance_beta: beta of the importance-sampling weights
      `w = (N * P(i)) ** -beta / max(w)` the dataset yields, in [0, 1].
    importance_beta_final: beta after `importance_beta_steps` train steps
      (linear annealing); None keeps `importance_beta`.
    importance_beta_steps: train steps over which beta is annealed.
    sequence_length: steps per item of a 'sequence' table; None means the
      manager's `sequence_length`.
    stride_length: steps between item starts of a 'sequence' table; None
      means the manager's `stride_length`.
    cross_episodes: let 'sequence' items straddle episode boundaries.
    episode_length: the longest item of an 'episode' table, in steps.
    long_episodes: 'split', 'truncate' or 'drop' (see above).
    block_length: packed items (uniform 'sequence' tables of the 'packed'
      layout): each Reverb item is a block of this many consecutive steps
      holding up to `block_length - sequence_length + 1` windows, started
      every that many steps so each window lies in exactly one block, with
      the block's window count as its priority (a prioritized selector of
      exponent 1): windows are sampled exactly uniformly, for ~5x less
      memory per step. `max_size` and `min_size_to_sample` still count
      windows. Needs stride 1, the 'fifo' remover, no `max_times_sampled`
      or `samples_per_insert`. None: one item per window.
    windows_per_item: windows cut from each sampled block (each uniform
      within it, so the marginal stays exactly uniform). More is faster but
      correlates the windows of a batch (they come from few stretches of
      experience); 1, the default, keeps a batch as independent as
      per-window items.
  """
  name: str = DEFAULT_TABLE_NAME
  kind: str = 'sequence'
  sampler: str = 'uniform'
  remover: str = 'fifo'
  max_size: Optional[int] = None
  max_times_sampled: int = 0
  min_size_to_sample: int = 1
  samples_per_insert: Optional[float] = None
  error_buffer: Optional[float] = None
  block_inserts_when_full: bool = False
  priority_exponent: float = 1.0
  initial_priority: Optional[float] = None
  priority_epsilon: float = 1e-6
  importance_beta: float = 0.4
  importance_beta_final: Optional[float] = None
  importance_beta_steps: int = 0
  sequence_length: Optional[int] = None
  stride_length: Optional[int] = None
  cross_episodes: bool = False
  episode_length: Optional[int] = None
  long_episodes: str = 'split'
  block_length: Optional[int] = None
  windows_per_item: int = 1

  def _fail(self, field: str, expected: str) -> None:
    raise ValueError(f'TableConfig({self.name!r}).{field} is '
                     f'{getattr(self, field)!r}; expected {expected}.')

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f'TableConfig.name must be a non-empty string, got '
                       f'{self.name!r}.')
    if self.kind not in KINDS:
      self._fail('kind', f'one of {KINDS}')
    if self.sampler not in SAMPLERS:
      self._fail('sampler', f'one of {SAMPLERS}')
    if self.remover not in REMOVERS:
      self._fail('remover', f'one of {REMOVERS}')
    if self.max_size is not None and (not _is_int(self.max_size) or
                                      self.max_size < 1):
      self._fail('max_size', 'a positive integer or None')
    if not _is_int(self.max_times_sampled) or self.max_times_sampled < 0:
      self._fail('max_times_sampled', 'an integer >= 0 (0 = no limit)')
    if not _is_int(self.min_size_to_sample) or self.min_size_to_sample < 1:
      self._fail('min_size_to_sample', 'an integer >= 1')
    for field in ('max_size', 'max_times_sampled', 'min_size_to_sample'):
      if (getattr(self, field) or 0) > REVERB_MAX_INT:
        self._fail(field, _TOO_LARGE)
    if self.max_size is not None and self.min_size_to_sample > self.max_size:
      self._fail('min_size_to_sample', f'<= max_size={self.max_size} (a '
                 'table can never hold more, so sampling would never start)')
    self._check_rate_limiter()
    if not _is_number(self.priority_exponent) or self.priority_exponent < 0:
      self._fail('priority_exponent', 'a number >= 0 (alpha; 0 is uniform)')
    if self.initial_priority is not None and (
        not _is_number(self.initial_priority) or self.initial_priority <= 0):
      self._fail('initial_priority', 'a number > 0 (an item of priority 0 is '
                 'never sampled), or None for the current maximum priority')
    if not _is_number(self.priority_epsilon) or self.priority_epsilon <= 0:
      self._fail('priority_epsilon', 'a number > 0, so no priority is zero')
    for field in ('importance_beta', 'importance_beta_final'):
      value = getattr(self, field)
      if (value is not None or field == 'importance_beta') and not (
          _is_number(value) and 0 <= value <= 1):
        self._fail(field, 'a number in [0, 1]')
    if not _is_int(self.importance_beta_steps) or self.importance_beta_steps < 0:
      self._fail('importance_beta_steps', 'an integer >= 0')
    if (self.importance_beta_final is not None) != (
        self.importance_beta_steps > 0):
      raise ValueError(
          f'TableConfig({self.name!r}): annealing beta needs both '
          f'importance_beta_final (got {self.importance_beta_final!r}) and '
          f'importance_beta_steps > 0 (got {self.importance_beta_steps!r}).')
    self._check_kind()
    self._check_blocks()

  def _check_blocks(self) -> None:
    if not _is_int(self.windows_per_item) or self.windows_per_item < 1:
      self._fail('windows_per_item', 'an integer >= 1')
    if self.block_length is None:
      return
    if not _is_int(self.block_length) or not (
        2 <= self.block_length <= REVERB_MAX_INT):
      self._fail('block_length', 'an integer >= 2, or None for one item per '
                 'window')
    needs = {'kind': 'sequence', 'sampler': 'uniform', 'remover': 'fifo',
             'max_times_sampled': 0, 'samples_per_insert': None,
             'block_inserts_when_full': False}
    for field, value in needs.items():
      if getattr(self, field) != value:
        self._fail(field, f'{value!r} for a table of packed items '
                   f'(block_length={self.block_length})')
    if self.sequence_length is not None and (
        self.sequence_length >= self.block_length):
      self._fail('block_length', f'> sequence_length={self.sequence_length} '
                 '(a block holds windows of sequence_length steps)')
    if self.stride_length not in (None, 1):
      self._fail('stride_length', '1 for a table of packed items (every '
                 'window is stored)')

  @property
  def windows_per_block(self) -> Optional[int]:
    """Windows a full block holds (None: not a table of packed items)."""
    if self.block_length is None or self.sequence_length is None:
      return None
    return self.block_length - self.sequence_length + 1

  def _check_rate_limiter(self) -> None:
    spi = self.samples_per_insert
    if spi is not None:
      if not _is_number(spi) or spi <= 0:
        self._fail('samples_per_insert', 'a number > 0, or None for no ratio '
                   'limit')
      if not _is_number(self.error_buffer) or self.error_buffer < max(1.0, spi):
        self._fail('error_buffer', f'a number >= max(1, samples_per_insert) = '
                   f'{max(1.0, spi):g} (a samples_per_insert limiter needs '
                   'room to alternate inserts and samples)')
      if 0 < self.max_times_sampled < spi:
        self._fail('samples_per_insert', f'<= max_times_sampled='
                   f'{self.max_times_sampled}: items are deleted after '
                   f'{self.max_times_sampled} samples, so the ratio could '
                   'never be reached and inserts would block forever')
    elif self.error_buffer is not None:
      self._fail('error_buffer', 'None unless samples_per_insert is set')
    if self.block_inserts_when_full:
      if (self.max_times_sampled != 1 or spi is not None or
          self.min_size_to_sample != 1):
        raise ValueError(
            f'TableConfig({self.name!r}).block_inserts_when_full needs '
            f'max_times_sampled=1 (got {self.max_times_sampled}), '
            f'samples_per_insert=None (got {spi!r}) and min_size_to_sample=1 '
            f'(got {self.min_size_to_sample}; Reverb\'s queue limiter samples '
            'from the first item).')

  def _check_kind(self) -> None:
    if self.kind == 'episode':
      if not _is_int(self.episode_length) or self.episode_length < 1:
        self._fail('episode_length', 'an integer >= 1 for an episode table')
      if self.episode_length > REVERB_MAX_INT:
        self._fail('episode_length', _TOO_LARGE)
      for field in ('sequence_length', 'stride_length'):
        if getattr(self, field) is not None:
          self._fail(field, "None for an episode table (use episode_length)")
      if self.cross_episodes:
        self._fail('cross_episodes', 'False for an episode table')
      if self.long_episodes not in LONG_EPISODE_POLICIES:
        self._fail('long_episodes', f'one of {LONG_EPISODE_POLICIES}')
    else:
      if self.episode_length is not None:
        self._fail('episode_length', "None for a sequence table (set "
                   "kind='episode' for whole episodes)")
      for field in ('sequence_length', 'stride_length'):
        value = getattr(self, field)
        if value is not None and (not _is_int(value) or value < 1):
          self._fail(field, 'an integer >= 1, or None for the manager\'s')
      if (self.sequence_length or 0) > REVERB_MAX_INT:
        self._fail('sequence_length', _TOO_LARGE)

  @property
  def item_length(self) -> int:
    """Steps per item (the longest item of an episode table)."""
    return self.episode_length if self.kind == 'episode' else \
        self.sequence_length

  @property
  def prioritized(self) -> bool:
    """Whether items are sampled by priority."""
    return self.sampler == 'prioritized'

  def resolve(self, *, capacity: int, sequence_length: int,
              stride_length: int) -> 'TableConfig':
    """Fills the fields left None with the manager's values.

    Args:
      capacity: the manager's capacity in items (for `max_size`).
      sequence_length: the manager's steps per item (sequence tables).
      stride_length: the manager's stride (sequence tables).

    Returns:
      A `TableConfig` with a concrete `max_size` (and, for sequence tables,
      `sequence_length` and `stride_length`).

    Raises:
      ValueError: if `capacity` is needed (`max_size` is None) but is not an
        integer in [1, 2**31 - 1], or the resolved config is inconsistent
        (e.g. `min_size_to_sample` above the capacity).
    """
    changes = {}
    if self.max_size is None:
      if not _is_int(capacity) or not 1 <= capacity <= REVERB_MAX_INT:
        raise ValueError(
            f'capacity is {capacity!r}, the max_size of table {self.name!r} '
            f'(which sets none); expected a positive integer' + (
                f' of at most {REVERB_MAX_INT} (2**31 - 1): Reverb 0.14 takes '
                'a table\'s max_size as a C++ int32 and refuses larger values'
                if _is_int(capacity) and capacity > 0 else '') + '.')
      changes['max_size'] = capacity
    if self.kind == 'sequence':
      if self.sequence_length is None:
        changes['sequence_length'] = sequence_length
      if self.stride_length is None:
        changes['stride_length'] = stride_length
    return dataclasses.replace(self, **changes) if changes else self

  def to_dict(self) -> dict:
    """Returns the config as a plain dict (for manifests and comparisons)."""
    return dataclasses.asdict(self)

  def inserts_before_blocking(self, *, inserts: int = 0, samples: int = 0,
                              size: int = 0) -> float:
    """Inserts this table's limiter lets through while nothing samples.

    Args:
      inserts: the limiter's insert count so far.
      samples: its sample count so far.
      size: the table's items now.

    Returns:
      `limiter.inserts_before_blocking` of this config (`math.inf` when only
      `min_size_to_sample` limits).
    """
    return limiter.inserts_before_blocking(self, inserts=inserts,
                                           samples=samples, size=size)


def normalize_stored(stored: dict, *, capacity: int, sequence_length: int,
                     stride_length: int) -> dict:
  """Brings a table config read from an older manifest to today's fields.

  Args:
    stored: one entry of a manifest's `tables`.
    capacity: the manifest's capacity.
    sequence_length: the manifest's sequence length.
    stride_length: the manifest's stride length.

  Returns:
    The `to_dict()` of the resolved config; `stored` unchanged if it cannot
    be read as a `TableConfig` (e.g. written by a newer version).
  """
  try:
    return TableConfig(**stored).resolve(
        capacity=capacity, sequence_length=sequence_length,
        stride_length=stride_length).to_dict()
  except (TypeError, ValueError):
    return stored


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
    `SAMPLING_ONLY_FIELDS` (beta, epsilon, initial priority) are not compared.
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
        if key in SAMPLING_ONLY_FIELDS:
          continue
        if old[name].get(key) != new[name].get(key):
          diffs.append((f'tables/{name}/{key}', old[name].get(key),
                        new[name].get(key)))
  return diffs
