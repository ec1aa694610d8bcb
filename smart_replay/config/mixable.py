"""Which tables can be drawn from together: a mix (a buffer's own table and
a starter's) or the shards of one table. Queues, tables that delete what is
sampled and tables of packed items cannot; shards must share one config; a
starter must store its steps as the buffer does.
"""

from typing import Any, Mapping, Sequence

from smart_replay.spec import specs


def check_drawable(config: Any, what: str) -> None:
  """Raises ValueError unless elements of `config`'s table can be drawn
  among another table's (a mix, or shards).

  Args:
    config: the table's `TableConfig`.
    what: the table, for the message (e.g. 'the online table').

  Raises:
    ValueError: for queues, tables that delete sampled items, and tables of
      packed items.
  """
  if config.sampler in ('fifo', 'lifo') or config.max_times_sampled:
    raise ValueError(
        f'cannot draw from {what} {config.name!r} (sampler='
        f'{config.sampler!r}, max_times_sampled={config.max_times_sampled}) '
        'among another table: queues and tables that delete sampled items '
        'have an order or a consumption a mix would break. Use uniform or '
        'prioritized tables.')
  if config.block_length is not None:
    raise ValueError(
        f'cannot draw from {what} {config.name!r} among another table: it '
        f'holds packed blocks (block_length={config.block_length}); use '
        'tables of one window per item.')


def check_shards(configs: Sequence[Any]) -> None:
  """Raises ValueError unless every shard's table has the same config.

  Args:
    configs: each shard's resolved `TableConfig` of the sampled table.

  Raises:
    ValueError: naming the shard and the first field that differs.
  """
  first = configs[0].to_dict()
  for index, config in enumerate(configs[1:], start=1):
    other = config.to_dict()
    for field in sorted(first):
      if field != 'max_size' and first[field] != other.get(field):
        raise ValueError(
            f'shard {index} serves table {config.name!r} with {field}='
            f'{other.get(field)!r}, shard 0 with {first[field]!r}; a sharded '
            'buffer needs one table config on every shard.')
  check_drawable(configs[0], 'the sharded table')


def check_mixable(online: Any, starter: Any, *, online_spec: Any,
                  starter_spec: Any, online_layout: Mapping[str, Any],
                  starter_layout: Mapping[str, Any]) -> None:
  """Raises ValueError unless a starter's table can share a batch with the
  buffer's own.

  Args:
    online: the buffer's table's resolved `TableConfig`.
    starter: the starter's table's resolved `TableConfig`.
    online_spec: the buffer's step spec (`data_spec`).
    starter_spec: the starter's.
    online_layout: the buffer's layout as its manifest records it
      (`Layout.describe()`).
    starter_layout: the starter's likewise.

  Raises:
    ValueError: naming the table, what differs and both values.
  """
  for side, config in (('online', online), ('starter', starter)):
    check_drawable(config, f'the {side} table')
  for field in ('kind', 'item_length'):
    if getattr(online, field) != getattr(starter, field):
      raise ValueError(
          f'the starter table {starter.name!r} has {field}='
          f'{getattr(starter, field)!r} but the online table {online.name!r} '
          f'has {getattr(online, field)!r}; mixed batches need items of one '
          'shape.')
  diffs = specs.diff_specs(starter_spec, online_spec)
  if diffs:
    raise ValueError(
        'the starter and the online table store different steps: '
        + '; '.join(f'{f}: starter {a}, online {b}' for f, a, b in diffs))
  differing = sorted(k for k in set(online_layout) | set(starter_layout)
                     if online_layout.get(k) != starter_layout.get(k))
  if differing:
    raise ValueError(
        'the starter and the online buffer store their steps differently '
        f'(layout {differing}: starter '
        f'{ {k: starter_layout.get(k) for k in differing} }, online '
        f'{ {k: online_layout.get(k) for k in differing} }); mixed batches '
        'need one stored step.')
