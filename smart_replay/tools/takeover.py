"""Taking over a buffer written without smart_replay: import a Reverb checkpoint.

`import_reverb_checkpoint(source, checkpoint_dir, data_spec=...)` reads the
newest complete plain Reverb checkpoint at `source` (see
`storage.foreign`), checks the user's `data_spec` against what it
stores (the table's signature, or else the decoded columns of its items),
and writes every item, in insertion order and with its priority, into a new
smart_replay buffer directory with a verified checkpoint and manifest. The
steps of overlapping items are written once, as the observer would.
"""

import collections
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from absl import logging
import numpy as np
import reverb
import tree

from smart_replay import _reverb_internal as reverb_internal
from smart_replay import errors
from smart_replay.config import tables as tables_lib
from smart_replay.manager import facade as manager_lib
from smart_replay import layouts
from smart_replay.layouts import packed_steps
from smart_replay.spec import specs
from smart_replay.storage import foreign
from smart_replay.storage import reader as checkpoint_reader
from smart_replay.utils import progress_log



class ImportResult(NamedTuple):
  """What an import wrote.

  Attributes:
    checkpoint: the smart_replay checkpoint written.
    source: the plain Reverb checkpoint read.
    table: the table read from it.
    items: items imported (every item of that table).
    steps: distinct stored steps those items reference, each written once
      (TF-Agents' observer stores the step at an episode boundary in both
      episodes, so this can exceed the environment steps: 351 for 300).
    sequence_length: steps per item.
  """
  checkpoint: str
  source: str
  table: str
  items: int
  steps: int
  sequence_length: int


def _pick_table(reader: checkpoint_reader.CheckpointReader,
                table: Optional[str]) -> str:
  """`table`, or the checkpoint's only table."""
  names = list(reader.tables())
  if table is None:
    if len(names) != 1:
      raise ValueError(f'{reader.path} holds tables {names}; pass table= to '
                       'say which one to import.')
    return names[0]
  if table not in names:
    raise ValueError(f'table {table!r} is not in {reader.path}; it holds '
                     f'{names}.')
  return table


def check_stored_spec(data_spec: Any, stored: Any, *, where: str) -> None:
  """Checks `data_spec` against what a checkpoint stores, field by field.

  Args:
    data_spec: the user's spec of one step.
    stored: the table's signature (a nest of specs with a time dimension),
      or the flat columns `[steps, ...]` of one stored item.
    where: names the checkpoint and table in the message.

  Raises:
    TrajectorySpecError: listing every field whose dtype or shape differs,
      with its path, or a different number of fields.
  """
  leaves = specs.flatten_spec(data_spec)
  if isinstance(stored, list):
    found = [(np.dtype(c.dtype).name, list(c.shape[1:])) for c in stored]
  else:
    found = [(s.dtype.name, s.shape.as_list()[1:]) for s in tree.flatten(stored)]
  if len(found) != len(leaves):
    raise errors.TrajectorySpecError(
        f'{where} stores {len(found)} fields per step '
        f'({["%s%s" % f for f in found]}); data_spec has {len(leaves)} '
        f'({[leaf.path for leaf in leaves]}).')
  wrong = [f"field {leaf.path!r}: stored {dtype}{shape}, data_spec "
           f"{leaf.dtype}{list(leaf.shape)}"
           for leaf, (dtype, shape) in zip(leaves, found)
           if (np.dtype(leaf.dtype).name, list(leaf.shape)) != (dtype, shape)]
  if wrong:
    raise errors.TrajectorySpecError(
        f'{where} does not store data_spec: ' + '; '.join(wrong) + '.')


def import_reverb_checkpoint(source: str, checkpoint_dir: str, *,
                             data_spec: Any, table: Optional[str] = None,
                             table_name: str = tables_lib.DEFAULT_TABLE_NAME,
                             capacity: Optional[int] = None,
                             layout: Optional[str] = None,
                             overwrite: bool = False,
                             stop_requested: Optional[Callable[[], bool]] = None
                             ) -> ImportResult:
  """Imports a plain Reverb checkpoint into a new smart_replay buffer.

  Args:
    source: a plain Reverb checkpoint folder, or a root of timestamped ones
      (the newest complete one is read, by the time in its name).
    checkpoint_dir: the smart_replay buffer directory to write.
    data_spec: the spec of one stored step (e.g. the agent's
      `collect_data_spec`); checked against the stored data.
    table: the table to import; default the checkpoint's only table.
    table_name: its name in the new buffer.
    capacity: the new buffer's capacity; default the stored table's
      `max_size` (at least the items imported).
    layout: the new buffer's layout (see `ReplayBufferManager`).
    overwrite: replace checkpoints already in `checkpoint_dir`.
    stop_requested: polled between items; when it returns True the import
      stops (raising KeyboardInterrupt) before any checkpoint is written.

  Returns:
    An `ImportResult`.

  Raises:
    CheckpointNotFoundError: if there is no complete Reverb checkpoint at
      `source`.
    ValueError: if `source` is a smart_replay buffer, the table is unknown
      or ambiguous, or its items have different lengths.
    TrajectorySpecError: if `data_spec` is not what the checkpoint stores
      (names each field).
    CheckpointExistsError: if `checkpoint_dir` holds checkpoints and
      `overwrite` is False.
    KeyboardInterrupt: if `stop_requested()` said so.
  """
  data_spec = specs.as_trajectory(data_spec)
  path = foreign.newest_foreign(source)
  reader = checkpoint_reader.CheckpointReader(path)  # No manifest: raw.
  table = _pick_table(reader, table)
  where = f'table {table!r} of {path}'
  items = list(reader.items(table))
  if not items:
    raise ValueError(f'{where} holds no items; there is nothing to import.')
  signature = reverb_internal.stored_signature(reader.stored_table(table))
  check_stored_spec(data_spec, signature if signature is not None else
                    items[0].columns, where=where)
  lengths = sorted({len(item.columns[0]) for item in items})
  if len(lengths) != 1 or items[0].squeezed:
    raise ValueError(f'{where} holds items of {lengths} steps; only tables of '
                     'equal-length sequence items can be imported.')
  length = lengths[0]
  capacity = max(capacity or reader.stored_table(table).max_size, len(items))
  manager = manager_lib.ReplayBufferManager(
      data_spec, capacity=capacity, checkpoint_dir=checkpoint_dir,
      sequence_length=length, layout=layout,
      table_configs=[tables_lib.TableConfig(name=table_name)])
  with manager:
    manager.create_replay_buffer(overwrite=overwrite)
    steps = _write_items(reverb.Client(manager.server_address), items,
                         table=table_name,
                         step_layout=layouts.layout_from_manifest(
                             manager.buffer_config),
                         stop_requested=stop_requested or (lambda: False))
    held = manager.num_frames()
    if held != len(items):
      raise errors.CheckpointCorruptError(
          f'imported {len(items)} items of {where}, but the new buffer holds '
          f'{held}.')
    checkpoint = manager.checkpoint(extra={
        'imported_from': path, 'imported_table': table,
        'imported_items': len(items), 'imported_steps': steps})
  logging.info('Imported %d items (%d steps) of %s into %s.', len(items),
               steps, where, checkpoint)
  return ImportResult(checkpoint, path, table, len(items), steps, length)


def _write_items(client: reverb.Client, items: List[Any], *, table: str,
                 step_layout: packed_steps.Layout,
                 stop_requested: Callable[[], bool]) -> int:
  """Writes `items` (insertion order, with priorities), each step once.

  Returns:
    The distinct steps written.
  """
  # When each step is used last (in append order), so the writer keeps every
  # reference an item still needs.
  order, last_use = {}, {}
  for index, item in enumerate(items):
    for step in item.steps:
      order.setdefault(step, len(order))
    for step in item.steps:
      last_use[step] = len(order)
  keep_alive = max(last_use[s] - order[s] for s in order) + 2
  chunk_length = min(32, keep_alive)
  writer = reverb_internal.new_trajectory_writer(
      client, chunk_length=chunk_length, keep_alive=keep_alive + chunk_length)
  append, create_item = reverb_internal.raw_calls(writer)
  refs: Dict[Any, Any] = {}
  remaining = collections.Counter(s for item in items for s in item.steps)
  squeeze = [False] * step_layout.num_columns
  progress = progress_log.ProgressLog('import', len(items), 'items')
  try:
    for index, item in enumerate(items):
      if stop_requested():
        raise KeyboardInterrupt(f'import stopped after {index} items')
      for position, step in enumerate(item.steps):
        if step not in refs:
          refs[step] = append(step_layout.columns(
              [column[position] for column in item.columns]))
      columns = [list(column) for column in zip(*(refs[s] for s in item.steps))]
      create_item(table, float(item.priority), columns, squeeze)
      for step in item.steps:
        remaining[step] -= 1
        if not remaining[step]:
          del refs[step]  # No later item uses it.
      progress.update(index + 1)
    writer.flush(timeout_ms=600_000)
  finally:
    progress.close()
    writer.close()
  return len(order)
