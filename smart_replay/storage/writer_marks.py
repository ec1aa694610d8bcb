"""Which of each writer's items a checkpoint holds, read from its files.

A layout with writer ids (`packed_steps.StepCodec(ids=True)`) stores with
every step its writer's id, its stream and the sequence number of the call
that wrote it; an item is known by the ids of its last step. Two readings:

* `read`: each writer's **marks**: for every (table, writer, stream), the
  newest call an item of the table ends at, and how many of the table's
  items end at that call (a call can complete several items of one table).
  Reverb stores one stream's items of a table in order, so a checkpoint
  holds (or has evicted) every item of that stream up to its mark, as long
  as nothing was sent again out of order; a manifest records them.
* `read_items`: every item each writer has there, by its last call, for a
  writer that sends again what a restarted server lacks
  (`resending.Resender.resend`): the items its old connection sent again by
  itself after the restart are there, out of order.

A table of packed items counts **windows**, not blocks: a block of W windows
is W ends, at the calls of its last W rows (a window ends at each), so a
writer can tell which windows a server lacks whatever blocks its first
connection made (`block_resending`).

Reading costs one pass over `items.tfrecord` and the decoding of the chunks
holding items' last steps (for packed rows, most of the checkpoint's data),
about 20 µs per item.

Marks are JSON: `{table: {writer_id: {stream: [seq, items]}}}`, the writer id
in 16 hex digits, the stream as a decimal string; items `{table: {writer_id:
{stream: [seq, ...]}}}`, sorted, a seq once per item.
"""

import collections
from typing import Any, Dict, Iterator, List, Tuple

import cramjam
from google.protobuf import message
import numpy as np
import tensorflow as tf

from smart_replay import _reverb_internal as reverb_internal
from smart_replay import errors
from smart_replay.storage import files as checkpoint_files
from smart_replay.storage import reader as reader_lib

Marks = Dict[str, Dict[str, Dict[str, List[int]]]]


def read(path: str, layout: Any) -> Marks:
  """Reads every writer's marks from a complete checkpoint folder.

  Args:
    path: the folder (Reverb's, or a committed `ckpt-N`).
    layout: the buffer's layout; it must store writer ids (`writer_ids`).

  Returns:
    The marks (see the module doc); every table of the checkpoint is a key,
    an empty one maps to `{}`.

  Raises:
    ValueError: if the layout stores no writer ids.
    CheckpointCorruptError: if a file, an item's chunk or a step cannot be
      read.
  """
  tables, ends = _item_ends(path, layout, every=False)
  newest: Dict[Tuple[str, int, int], List[int]] = {}
  for table, writer, stream, seq, count in ends:
    mark = newest.get((table, writer, stream))
    if mark is None or seq > mark[0]:
      newest[(table, writer, stream)] = [seq, count]
    elif seq == mark[0]:
      mark[1] += count
  marks: Marks = {table: {} for table in tables}
  for (table, writer, stream), mark in sorted(newest.items()):
    marks.setdefault(table, {}).setdefault(f'{writer:016x}', {})[
        str(stream)] = mark
  return marks


def read_items(path: str, layout: Any) -> Marks:
  """Reads every item each writer has in a complete checkpoint folder.

  Args:
    path: the folder (Reverb's, or a committed `ckpt-N`).
    layout: the buffer's layout; it must store writer ids (`writer_ids`).

  Returns:
    `{table: {writer_id: {stream: [seq, ...]}}}`: each item's last call,
    sorted (a seq once per item); every table of the checkpoint is a key.

  Raises:
    ValueError: if the layout stores no writer ids.
    CheckpointCorruptError: as `read`.
  """
  tables, ends = _item_ends(path, layout, every=True)
  found: Dict[Tuple[str, int, int], List[int]] = collections.defaultdict(
      list)
  for table, writer, stream, seq, count in ends:
    found[(table, writer, stream)] += [seq] * count
  items: Marks = {table: {} for table in tables}
  for (table, writer, stream), seqs in sorted(found.items()):
    items.setdefault(table, {}).setdefault(f'{writer:016x}', {})[
        str(stream)] = sorted(seqs)
  return items


def _item_ends(path: str, layout: Any, *, every: bool
               ) -> Tuple[List[str], Iterator[Tuple[str, int, int, int, int]]]:
  """The checkpoint's tables, and `(table, writer, stream, seq, items)` of
  item ends: every one (`every`), or only the newest of each chunk (a chunk
  holds one stream's steps in order, so only its newest item end can be a
  mark)."""
  if not getattr(layout, 'writer_ids', False):
    raise ValueError(f'the layout {layout.describe()} stores no writer ids.')
  try:
    tables = [t.table_name for t in checkpoint_files.records(
        path, 'tables.tfrecord',
        reverb_internal.checkpoint_pb2.PriorityTableCheckpoint)]
    # Per chunk and (table, column tensor): {step an item ends at: [items,
    # windows if it is a block (an item of one step; a frame-stacked window
    # holds its lookback cells too), else 0]}.
    wanted: Dict[int, Dict[Tuple[str, int], Dict[int, List[Any]]]] = (
        collections.defaultdict(lambda: collections.defaultdict(dict)))
    for item in checkpoint_files.records(
        path, 'items.tfrecord', reverb_internal.schema_pb2.PrioritizedItem):
      pieces = item.flat_trajectory.columns[0].chunk_slices
      piece = pieces[-1]
      step = piece.offset + piece.length - 1
      steps = wanted[piece.chunk_key][(item.table, piece.index)]
      if not every and steps and step < next(iter(steps)):
        continue
      if not every and steps and step > next(iter(steps)):
        steps.clear()
      if step in steps:
        steps[step][0] += 1
      else:
        block = len(pieces) == 1 and piece.length == 1
        steps[step] = [1, int(round(item.priority)) if block else 0]
    ends = []
    found = 0
    for chunk in checkpoint_files.records(
        path, 'chunks.tfrecord', reverb_internal.schema_pb2.ChunkData):
      per_table = wanted.get(chunk.chunk_key)
      if not per_table:
        continue
      found += 1
      decoded = {}
      for (table, index), steps in per_table.items():
        if index not in decoded:
          decoded[index] = reader_lib.decode_tensor(
              chunk.data.tensors[index], chunk.delta_encoded)
        for step, (count, windows) in steps.items():
          writers, streams, seqs = (np.atleast_1d(a) for a in layout.read_ids(
              decoded[index][step], block=bool(windows)))
          real = np.flatnonzero(writers)  # A block's unused rows are zeros.
          if not len(real):
            continue
          if windows:  # A window ends at each of the last `windows` rows.
            ends += [(table, int(writers[r]), int(streams[r]), int(seqs[r]),
                      1) for r in real[-windows:]]
            continue
          last = real[np.argmax(seqs[real])]
          ends.append((table, int(writers[last]), int(streams[last]),
                       int(seqs[last]), count))
  except (tf.errors.OpError, message.DecodeError, cramjam.DecompressionError,
          ValueError, IndexError) as e:
    raise errors.CheckpointCorruptError(
        f'cannot read the writer ids of {path}: {e}') from e
  if found != len(wanted):
    raise errors.CheckpointCorruptError(
        f'{path}: items reference {len(wanted) - found} chunk(s) that are '
        'not in chunks.tfrecord.')
  return tables, iter(ends)
