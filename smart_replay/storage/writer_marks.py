"""Each writer's marks in a checkpoint: the last of its calls a table holds.

A layout with writer ids (`packed_steps.StepCodec(ids=True)`) stores with
every step its writer's id, its stream and the sequence number of the call
that wrote it. Reverb writes one stream's items of a table in order, so the
items of a table a checkpoint holds from one stream are all of that stream's
items up to the newest one, less those evicted or sampled away: the newest
item's last step says exactly how far the table holds what the stream wrote.
`read` finds it for every (table, writer, stream), from the checkpoint's
files: the item's last step marks the call, and `items` counts the table's
items that end at that call (a call can complete several items of one table,
and a save can fall between them).

Reading costs one pass over `items.tfrecord` and the decoding of each chunk
holding an item's last step (for packed rows, most of the checkpoint's data):
the manifest records the result, so it is read once per checkpoint.

Marks are JSON: `{table: {writer_id: {stream: [seq, items]}}}`, the writer id
in 16 hex digits, the stream as a decimal string.
"""

import collections
from typing import Any, Dict, List, Tuple

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
  if not getattr(layout, 'writer_ids', False):
    raise ValueError(f'the layout {layout.describe()} stores no writer ids.')
  try:
    tables = [t.table_name for t in checkpoint_files.records(
        path, 'tables.tfrecord',
        reverb_internal.checkpoint_pb2.PriorityTableCheckpoint)]
    # Per chunk, for each (table, column tensor), the newest step an item
    # ends at in it and how many items end there, and whether those items
    # are blocks: a chunk holds one stream's steps in order, so only its
    # newest item end can be a mark.
    wanted: Dict[int, Dict[Tuple[str, int], List[Any]]] = (
        collections.defaultdict(dict))
    for item in checkpoint_files.records(
        path, 'items.tfrecord', reverb_internal.schema_pb2.PrioritizedItem):
      pieces = item.flat_trajectory.columns[0].chunk_slices
      piece = pieces[-1]
      step = piece.offset + piece.length - 1
      newest = wanted[piece.chunk_key].get((item.table, piece.index))
      if newest is None or step > newest[0]:
        # An item of one step is a block (a frame-stacked window holds its
        # lookback cells too).
        wanted[piece.chunk_key][(item.table, piece.index)] = [
            step, 1, len(pieces) == 1 and piece.length == 1]
      elif step == newest[0]:
        newest[1] += 1
    ends: Dict[Tuple[str, int, int], List[int]] = {}
    found = 0
    for chunk in checkpoint_files.records(
        path, 'chunks.tfrecord', reverb_internal.schema_pb2.ChunkData):
      items = wanted.get(chunk.chunk_key)
      if not items:
        continue
      found += 1
      decoded = {}
      for (table, index), (step, count, block) in items.items():
        if index not in decoded:
          decoded[index] = reader_lib.decode_tensor(
              chunk.data.tensors[index], chunk.delta_encoded)
        writers, streams, seqs = (np.atleast_1d(a) for a in layout.read_ids(
            decoded[index][step], block=block))
        real = np.flatnonzero(writers)  # A block's unused rows are zeros.
        if not len(real):
          continue
        last = real[np.argmax(seqs[real])]
        key = (table, int(writers[last]), int(streams[last]))
        seq = int(seqs[last])
        mark = ends.get(key)
        if mark is None or seq > mark[0]:
          ends[key] = [seq, count]
        elif seq == mark[0]:
          mark[1] += count
  except (tf.errors.OpError, message.DecodeError, cramjam.DecompressionError,
          ValueError, IndexError) as e:
    raise errors.CheckpointCorruptError(
        f'cannot read the writer marks of {path}: {e}') from e
  if found != len(wanted):
    raise errors.CheckpointCorruptError(
        f'{path}: items reference {len(wanted) - found} chunk(s) that are '
        'not in chunks.tfrecord.')
  marks: Marks = {table: {} for table in tables}
  for (table, writer, stream), mark in sorted(ends.items()):
    marks.setdefault(table, {}).setdefault(f'{writer:016x}', {})[
        str(stream)] = mark
  return marks
