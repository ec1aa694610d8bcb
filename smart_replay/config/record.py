"""A buffer's configuration as a manifest records it, and how two compare.

`build_config` is the JSON a checkpoint's manifest stores for the buffer
(spec, lengths, capacity, tables, layout); `diff_config` lists every field
where a stored config differs from a requested one, and `format_differences`
prints such a list one field per line.
"""

from typing import Any, List, Optional, Tuple

from smart_replay.config import tables as tables_lib
from smart_replay.layouts import packed_steps
from smart_replay.spec import specs

# Fields that must match between a checkpoint and the manager that loads it.
CONFIG_FIELDS = ('sequence_length', 'stride_length', 'capacity')


def build_config(*, data_spec: Any, sequence_length: int, stride_length: int,
                 capacity: int,
                 table_configs: List[tables_lib.TableConfig],
                 layout: Optional[dict] = None) -> dict:
  """Describes a buffer's configuration as a manifest would store it.

  Args:
    data_spec: the buffer's data spec.
    sequence_length: steps per item.
    stride_length: steps between the starts of consecutive items.
    capacity: the manager's capacity (default table size).
    table_configs: the resolved table configs.
    layout: `packed_steps.Layout.describe()` of the storage layout; None for
      one column per field (`{'name': 'columns'}`).

  Returns:
    A JSON-serializable dict with `data_spec`, `sequence_length`,
    `stride_length`, `capacity`, `tables` and `layout`.
  """
  return {
      'data_spec': specs.spec_to_json(data_spec),
      'sequence_length': sequence_length,
      'stride_length': stride_length,
      'capacity': capacity,
      'tables': [t.to_dict() for t in table_configs],
      'layout': layout or {'name': 'columns'},
  }


def diff_config(stored: dict, requested: dict) -> List[Tuple[str, Any, Any]]:
  """Lists every field where a stored config differs from a requested one.

  Args:
    stored: a manifest (or `build_config` result) from disk.
    requested: what `build_config` returns for the loading manager.

  Returns:
    `(field, stored_value, requested_value)` tuples; empty when they match.
  """
  diffs = specs.diff_spec_leaves(stored['data_spec']['leaves'],
                                 requested['data_spec']['leaves'])
  for field in CONFIG_FIELDS:
    if stored.get(field) != requested.get(field):
      diffs.append((field, stored.get(field), requested.get(field)))
  # Configs written before layouts were recorded stored one column per field.
  layouts = [packed_steps.stored_layout(c) for c in (stored, requested)]
  if layouts[0]['name'] != layouts[1]['name']:
    diffs.append(('layout', layouts[0]['name'], layouts[1]['name']))
  elif layouts[0] != layouts[1] and not diffs:  # Not just another spec.
    diffs.append(('layout (byte layout)', layouts[0], layouts[1]))
  stored_tables = [tables_lib.normalize_stored(
      t, capacity=stored.get('capacity'),
      sequence_length=stored.get('sequence_length'),
      stride_length=stored.get('stride_length')) for t in stored['tables']]
  diffs += tables_lib.diff_table_configs(stored_tables, requested['tables'])
  return diffs


def format_differences(diffs: List[Tuple[str, Any, Any]],
                       left: str = 'checkpoint',
                       right: str = 'requested') -> str:
  """Formats differences as one indented line per field.

  Args:
    diffs: `(field, left_value, right_value)` tuples.
    left: label of the first value.
    right: label of the second value.

  Returns:
    A multi-line string, e.g. "  capacity: checkpoint=50000, requested=1000".
  """
  return '\n'.join(f'  {field}: {left}={a!r}, {right}={b!r}'
                   for field, a, b in diffs)
