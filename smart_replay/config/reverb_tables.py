"""Reverb tables from `TableConfig`s, and checking what a server really serves.

`make_table` turns a resolved `TableConfig` into a `reverb.Table` with the
signature derived from the data spec; `server_differences` checks that a
running server serves what was asked for (Reverb silently lets a restored
checkpoint's config win).
"""

from typing import Any, Dict, List, Sequence, Tuple

import reverb
import tensorflow as tf

from smart_replay.spec import specs


def _selector(kind: str, priority_exponent: float):
  if kind == 'prioritized':
    return reverb.selectors.Prioritized(priority_exponent)
  return {'uniform': reverb.selectors.Uniform,
          'fifo': reverb.selectors.Fifo,
          'lifo': reverb.selectors.Lifo}[kind]()


def blocks(config: Any, windows: int) -> int:
  """The Reverb items (blocks) that hold `windows` windows of a table of
  packed items, or `windows` itself for any other table."""
  per_block = config.windows_per_block
  return windows if per_block is None else -(-windows // per_block)


def _rate_limiter(config: Any):
  if config.block_length is not None:
    return reverb.rate_limiters.MinSize(blocks(config,
                                               config.min_size_to_sample))
  if config.block_inserts_when_full:
    return reverb.rate_limiters.Queue(config.max_size)
  if config.samples_per_insert is None:
    return reverb.rate_limiters.MinSize(config.min_size_to_sample)
  return reverb.rate_limiters.SampleToInsertRatio(
      samples_per_insert=config.samples_per_insert,
      min_size_to_sample=config.min_size_to_sample,
      error_buffer=config.error_buffer)


def signature(config: Any, data_spec: Any, lookback: int = 0) -> Any:
  """The Reverb signature of `config`'s items.

  Args:
    config: a resolved table config.
    data_spec: the spec of one step.
    lookback: steps an item references before its first one (a frame-stacked
      layout's; see `frame_stacks.FrameStackedLayout`).

  Returns:
    A nest of `tf.TensorSpec` with an outer time dimension: `sequence_length`
    for sequence tables, unknown (variable) for episode tables, and 1 for
    tables of packed items, whose one step is a block `[block_length,
    bytes_per_step]` of packed steps (or one blob of cells, when a step is
    a `tf.string` blob of a frame-stacked layout).
  """
  if config.block_length is not None and data_spec.dtype == tf.string:
    return specs.table_signature(data_spec, 1)
  if config.block_length is not None:
    return specs.table_signature(tf.TensorSpec(
        [config.block_length] + data_spec.shape.as_list(), data_spec.dtype,
        name=data_spec.name), 1)
  if config.kind == 'episode':
    return specs.table_signature(data_spec, None)
  return specs.table_signature(data_spec, config.sequence_length + lookback)


def make_table(config: Any, data_spec: Any, lookback: int = 0
               ) -> reverb.Table:
  """Builds the `reverb.Table` described by `config`.

  Args:
    config: the table's configuration, resolved (see `TableConfig.resolve`).
    data_spec: the spec of one step (e.g. `agent.collect_data_spec`).
    lookback: steps an item references before its first one (see
      `signature`).

  Returns:
    A `reverb.Table` whose signature fits `config`'s items.

  Raises:
    ValueError: if `config` is not resolved.
  """
  if config.max_size is None or config.item_length is None:
    raise ValueError(f'TableConfig({config.name!r}) is not resolved (max_size='
                     f'{config.max_size!r}, sequence_length='
                     f'{config.sequence_length!r}); call resolve() first.')
  # Blocks are sampled in proportion to the windows they hold (their
  # priority): every window equally likely.
  sampler = (reverb.selectors.Prioritized(1.0) if config.block_length else
             _selector(config.sampler, config.priority_exponent))
  return reverb.Table(
      name=config.name, sampler=sampler,
      remover=_selector(config.remover, config.priority_exponent),
      max_size=blocks(config, config.max_size),
      rate_limiter=_rate_limiter(config),
      max_times_sampled=config.max_times_sampled,
      signature=signature(config, data_spec, lookback))


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
  check('signature', specs.describe_signature(info.signature),
        specs.describe_signature(want.signature))
  return diffs


def server_differences(configs: Sequence[Any], data_spec: Any,
                       info: Dict[str, reverb.reverb_types.TableInfo],
                       lookback: int = 0) -> List[Tuple[str, Any, Any]]:
  """Compares the tables `configs` make with what a running server serves.

  Args:
    configs: resolved table configs.
    data_spec: the spec of one step.
    info: the server's `server_info()`.
    lookback: steps an item references before its first one.

  Returns:
    `(field, running_value, requested_value)` per difference (see
    `running_table_differences`); a table the server lacks is
    `('tables/<name>', '<missing>', 'present')`.
  """
  diffs = []
  for config in configs:
    if config.name not in info:
      diffs.append((f'tables/{config.name}', '<missing>', 'present'))
    else:
      diffs += running_table_differences(make_table(config, data_spec,
                                                    lookback),
                                         info[config.name])
  return diffs
