"""Reading the items and steps stored in a Reverb checkpoint, without a server.

Reverb has no API to read a table in order, and a server started from a
checkpoint takes the checkpoint's table config (sampler, `max_times_sampled`),
so reading through sampling cannot promise every item exactly once. The
checkpoint files can: `items.tfrecord` holds each item (table, key, priority,
times sampled, insertion time, and per column the chunk slices it uses) and
`chunks.tfrecord` the chunks (per column, the steps `start..end` of one
episode, snappy-compressed; integers optionally delta-encoded). This module
decodes them with Reverb's own protos.

`CheckpointReader(path).items(table)` yields every item of a table once, in
insertion order; `.pieces(table)` rebuilds the steps those items hold, as
runs of consecutive steps of one episode. Given the buffer's
layout (`layouts.protocol.StepLayout`), it decodes its steps, so items always
hold one column per field of the spec.
"""

import collections
import os
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

import cramjam
from google.protobuf import message
import numpy as np
import tensorflow as tf
import tree

from smart_replay import _reverb_internal as reverb_internal
from smart_replay import errors
from smart_replay import layouts
from smart_replay.layouts import protocol
from smart_replay.storage import files as checkpoint_files
from smart_replay.storage import manifest as manifest_lib
from smart_replay.utils import progress_log


class StoredItem(NamedTuple):
  """One item of a checkpoint, with its data.

  Attributes:
    table: its table.
    key: Reverb's item key.
    priority: its priority.
    times_sampled: how often it was sampled before the checkpoint.
    inserted_at: insertion time, nanoseconds since the epoch.
    columns: one array `[steps, ...]` per field, in spec-flattening order.
    steps: `(episode_id, index)` of each of its steps.
    squeezed: some column is a single step without a time dimension.
  """
  table: str
  key: int
  priority: float
  times_sampled: int
  inserted_at: int
  columns: List[np.ndarray]
  steps: List[Tuple[int, int]]
  squeezed: bool = False


class Piece(NamedTuple):
  """Consecutive steps of one episode, as a buffer holds them.

  Attributes:
    episode_id: Reverb's episode id.
    start: index of the first step within the episode (0: the episode's
      start is stored).
    columns: one array `[steps, ...]` per field, in spec-flattening order.
  """
  episode_id: int
  start: int
  columns: List[np.ndarray]

  @property
  def num_steps(self) -> int:
    """Returns the number of steps in this piece."""
    return len(self.columns[0])


def decode_tensor(proto, delta_encoded: bool) -> np.ndarray:
  """One tensor of a checkpoint's chunk, decoded.

  Args:
    proto: a `TensorProto` of `ChunkData.data.tensors`.
    delta_encoded: the chunk's `delta_encoded`.

  Returns:
    The column's steps, `[steps, ...]`.

  Raises:
    cramjam.DecompressionError, ValueError: if the tensor is damaged.
  """
  dtype = tf.as_dtype(proto.dtype).as_numpy_dtype
  shape = [d.size for d in proto.tensor_shape.dim]
  if proto.dtype == tf.string.as_datatype_enum:  # Stored as is: no snappy.
    return tf.io.parse_tensor(proto.SerializeToString(), tf.string).numpy()
  raw = bytes(cramjam.snappy.decompress_raw(proto.tensor_content))
  array = np.frombuffer(raw, dtype).reshape(shape)
  # Reverb delta-encodes only integer tensors of rank >= 2 (steps x ...):
  # differences along the steps.
  if delta_encoded and np.issubdtype(dtype, np.integer) and array.ndim >= 2:
    array = np.cumsum(array, axis=0, dtype=dtype)
  return array


class CheckpointReader:
  """Reads the items and steps of one complete Reverb checkpoint folder.

  Args:
    path: a checkpoint folder (`ckpt-N`, or Reverb's timestamped folder).
    layout: how the buffer stored its steps (`protocol.StepLayout`); None reads
      it from the folder's `manifest.json` (a `ckpt-N` folder), and reads
      the columns as Reverb stores them if there is none (e.g. a throwaway
      snapshot: pass its buffer's layout).

  Raises:
    CheckpointCorruptError: if the folder is incomplete or a file cannot be
      read; names the folder and the problem.
  """

  def __init__(self, path: str,
               layout: Optional[protocol.StepLayout] = None):
    manifest_path = os.path.join(path, manifest_lib.MANIFEST_NAME)
    if layout is None and os.path.exists(manifest_path):
      try:
        layout = layouts.layout_from_manifest(manifest_lib.read(manifest_path))
      except (OSError, KeyError, ValueError) as e:
        raise errors.CheckpointCorruptError(
            f'cannot read the layout of {path} from its manifest: {e}') from e
    # None: a checkpoint without a manifest (TF-Agents' own), whose columns
    # are its fields.
    self._layout = layout
    # Cells a frame-stacked layout's items hold before their first step.
    self._lookback = 0 if layout is None else layout.lookback
    missing = checkpoint_files.missing_files(path)
    if missing:
      raise errors.CheckpointCorruptError(
          f'{path} is not a complete Reverb checkpoint: missing {missing}.')
    self.path = path
    try:
      self._table_protos = {
          table.table_name: table for table in checkpoint_files.records(
              path, 'tables.tfrecord',
              reverb_internal.checkpoint_pb2.PriorityTableCheckpoint)}
      self._table_names = list(self._table_protos)
      self._chunks = {chunk.chunk_key: chunk for chunk in
                      checkpoint_files.records(path, 'chunks.tfrecord',
                                               reverb_internal.schema_pb2.ChunkData)}
      self._items = list(checkpoint_files.records(
          path, 'items.tfrecord', reverb_internal.schema_pb2.PrioritizedItem))
    except (tf.errors.OpError, ValueError, message.DecodeError) as e:
      raise errors.CheckpointCorruptError(
          f'cannot read the checkpoint files in {path}: {e}') from e
    # Insertion order: Reverb stamps each item with the server's clock when
    # it is inserted (a stable sort keeps the file order of equal stamps).
    self._items.sort(key=lambda item: (item.inserted_at.seconds,
                                       item.inserted_at.nanos))
    self._decoded = collections.OrderedDict()  # A small cache of chunks.

  def tables(self) -> Dict[str, int]:
    """Returns `{table: number of items}` for every table, empty ones too."""
    counts = collections.Counter(item.table for item in self._items)
    return {name: counts.get(name, 0) for name in self._table_names}

  def stored_table(self, table: str) -> Any:
    """The checkpoint's record of `table` (`PriorityTableCheckpoint`: its
    `max_size`, sampler, rate limiter, `signature`, ...).

    Raises:
      ValueError: if `table` is not in the checkpoint.
    """
    self._check_table(table)
    return self._table_protos[table]

  def priorities(self, table: str) -> List[float]:
    """Returns the priorities of `table`'s items (nothing is decoded).

    Raises:
      ValueError: if `table` is not in the checkpoint.
    """
    self._check_table(table)
    return [item.priority for item in self._items if item.table == table]

  def _check_table(self, table: Optional[str]) -> None:
    if table is not None and table not in self._table_names:
      raise ValueError(f'table {table!r} is not in {self.path}; it holds '
                       f'{self._table_names}.')

  def _chunk(self, key: int) -> List[np.ndarray]:
    if key in self._decoded:
      self._decoded.move_to_end(key)
      return self._decoded[key]
    chunk = self._chunks.get(key)
    if chunk is None:
      raise errors.CheckpointCorruptError(
          f'{self.path}: an item references chunk {key}, which is not in '
          'chunks.tfrecord.')
    try:
      tensors = [decode_tensor(t, chunk.delta_encoded)
                 for t in chunk.data.tensors]
    except (cramjam.DecompressionError, ValueError) as e:
      raise errors.CheckpointCorruptError(
          f'{self.path}: chunk {key} cannot be decoded: {e}') from e
    self._decoded[key] = tensors
    if len(self._decoded) > 256:
      self._decoded.popitem(last=False)
    return tensors

  def items(self, table: Optional[str] = None) -> Iterator[StoredItem]:
    """Yields every item (of `table`, or of all tables) once, oldest first.

    Args:
      table: a table name; None for every table.

    Yields:
      `StoredItem`s in insertion order.

    Raises:
      ValueError: if `table` is not in the checkpoint.
      CheckpointCorruptError: if an item's chunk is missing or damaged.
    """
    self._check_table(table)
    for item in self._items:
      if table is not None and item.table != table:
        continue
      columns, steps = [], []
      for index, column in enumerate(item.flat_trajectory.columns):
        parts = []
        for piece in column.chunk_slices:
          data = self._chunk(piece.chunk_key)[piece.index]
          parts.append(data[piece.offset:piece.offset + piece.length])
          if index == 0:
            span = self._chunks[piece.chunk_key].sequence_range
            steps += [(span.episode_id, span.start + piece.offset + i)
                      for i in range(piece.length)]
        data = np.concatenate(parts) if len(parts) > 1 else parts[0]
        columns.append(data[0] if column.squeeze else data)
      if self._layout is not None:  # Back to the fields.
        columns = self._layout.stored_fields(columns)
      if self._lookback and len(steps) > 1:  # Not a block: its steps.
        steps = steps[self._lookback:]
      yield StoredItem(item.table, item.key, item.priority,
                       item.times_sampled,
                       item.inserted_at.seconds * 10**9 + item.inserted_at.nanos,
                       columns, steps,
                       any(c.squeeze for c in item.flat_trajectory.columns))

  def pieces(self, table: str) -> List[Piece]:
    """Rebuilds the steps `table`'s items hold, as runs of one episode.

    Each stored step appears once; an episode whose first items were
    evicted starts late (`Piece.start > 0`), and steps no item holds split
    an episode into several pieces.

    Args:
      table: the table whose items define the stored steps.

    Returns:
      Pieces ordered by their episode's first insertion, then by step.

    Raises:
      ValueError: if `table` is not in the checkpoint, or its items have
        single-step (squeezed) columns.
      CheckpointCorruptError: if an item's chunk is missing or damaged.
    """
    steps: Dict[Tuple[int, int], List[np.ndarray]] = {}
    episodes: Dict[int, None] = {}  # Insertion order of the episodes.
    with progress_log.ProgressLog('read', self.tables().get(table, 0),
                                  'items') as progress:
      count = 0
      for count, item in enumerate(self.items(table), 1):
        if item.squeezed:
          raise ValueError(f'table {table!r} has single-step (squeezed) '
                           'columns; pieces need items of steps.')
        for position, step in enumerate(item.steps):
          episodes.setdefault(step[0])
          if step not in steps:
            steps[step] = [c[position] for c in item.columns]
        if count % 1024 == 0:
          progress.update(count)
      progress.update(count)
    by_episode = collections.defaultdict(list)
    for episode_id, index in sorted(steps):
      by_episode[episode_id].append(index)
    pieces = []
    for episode_id in episodes:
      indices = by_episode[episode_id]
      run = [indices[0]]
      for index in indices[1:] + [None]:
        if index is not None and index == run[-1] + 1:
          run.append(index)
          continue
        columns = [np.stack(field) for field in zip(
            *(steps[(episode_id, i)] for i in run))]
        pieces.append(Piece(episode_id, run[0], columns))
        if index is not None:
          run = [index]
    return pieces


def unflatten(data_spec: Any, columns: List[np.ndarray]) -> Any:
  """Packs flat columns into the structure of `data_spec`.

  Args:
    data_spec: the buffer's spec nest.
    columns: one array per field, in spec-flattening order (as
      `StoredItem.columns` and `Piece.columns`).

  Returns:
    The nest, e.g. a `Trajectory` of arrays.
  """
  return tree.unflatten_as(data_spec, columns)
