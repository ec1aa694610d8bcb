"""One packed byte column per step: every field of a step in one `uint8` row.

Reverb pays a fixed cost per column of every item (a chunk reference, a
slice, C++ bookkeeping), so a step of seven fields costs seven times what one
column would. `StepCodec` packs all fields of a step, whatever their dtypes,
into one `uint8[bytes_per_step]` row (each field's bytes in `tree.flatten`
order, native byte order), and decodes a batch of such rows back into the
spec's dtypes and shapes inside `tf.data` with `tf.bitcast`.

A codec made with `ids=True` ends every row with 16 more bytes, the step's
writer ids (`WRITER_IDS`: the writer's id, its stream and the sequence number
of the call that wrote the step), stamped by the observer (`stamp_ids`) and
read from checkpoints (`read_ids`) to know what each writer's steps a table
holds; decoding never reads them, so samples are unchanged.

The codec is pure: it needs no server, and the same spec always gives the
same layout (recorded in a manifest as `describe()`).
"""

import struct
import sys
from typing import Any, Dict, List, Mapping, NamedTuple, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf
import tree

from smart_replay.layouts import packed_items
from smart_replay.spec import specs

# The only dtypes whose bytes have one meaning: numbers and booleans.
_PACKABLE_KINDS = 'biuf'

# The writer ids that end a row of a codec with `ids`: two little-endian
# uint64, the writer's id and `stream << SEQ_BITS | seq`.
WRITER_IDS = np.dtype('<u8')
IDS_BYTES = 2 * WRITER_IDS.itemsize
SEQ_BITS = 48  # Sequence numbers below 2**48; streams below 2**16.
MAX_STREAMS = 1 << (64 - SEQ_BITS)
_IDS = struct.Struct('<QQ')


class FieldSlot(NamedTuple):
  """Where one field of the spec lives in a packed row.

  Attributes:
    path: the field's path in the spec, e.g. 'observation/temperature'.
    dtype: the field's numpy dtype.
    shape: the field's shape (static; packing needs it).
    offset: the first byte of the field in the row.
    nbytes: the field's bytes in the row.
  """
  path: str
  dtype: np.dtype
  shape: tuple
  offset: int
  nbytes: int


class StepCodec:
  """Packs the fields of a step into one byte row, and decodes rows back.

  Args:
    data_spec: the spec of one step (a nest of `tf.TensorSpec`); every field
      needs a fully known shape and a numeric or boolean dtype.
    ids: whether rows end with the step's writer ids (`IDS_BYTES`, zero
      until `stamp_ids`).

  Raises:
    ValueError: naming the first field whose shape is not fully known or
      whose dtype (e.g. string) has no fixed byte form.
  """

  def __init__(self, data_spec: Any, *, ids: bool = False):
    self._spec = data_spec
    self.ids = bool(ids)
    slots, offset = [], 0
    for leaf in specs.flatten_spec(data_spec):
      dtype = np.dtype(tf.as_dtype(leaf.dtype).as_numpy_dtype)
      if dtype.kind not in _PACKABLE_KINDS:
        raise ValueError(
            f'field {leaf.path!r} has dtype {leaf.dtype}, which has no fixed '
            'byte form; a packed layout needs numeric or boolean fields '
            "(use layout='columns' for this spec).")
      if any(d is None for d in leaf.shape):
        raise ValueError(
            f'field {leaf.path!r} has shape {list(leaf.shape)} with an unknown '
            "dimension; a packed layout needs fully known shapes (use "
            "layout='columns' for this spec).")
      nbytes = int(np.prod(leaf.shape, dtype=np.int64)) * dtype.itemsize
      slots.append(FieldSlot(leaf.path, dtype, tuple(leaf.shape), offset,
                             nbytes))
      offset += nbytes
    self._slots = slots
    self._fields_bytes = offset
    self._bytes_per_step = offset + (IDS_BYTES if ids else 0)
    self._ids_zeros = bytes(IDS_BYTES)
    self._dtypes = tuple(s.dtype for s in slots)
    self._first_rank = len(slots[0].shape) if slots else 0

  @property
  def bytes_per_step(self) -> int:
    """The length of one packed row."""
    return self._bytes_per_step

  @property
  def slots(self) -> List[FieldSlot]:
    """Every field's place in the row, in `tree.flatten` order."""
    return list(self._slots)

  def describe(self) -> Dict[str, Any]:
    """The layout as a manifest records it.

    Returns:
      `{'bytes_per_step', 'byte_order', 'fields': [{'path', 'dtype',
      'shape', 'offset', 'nbytes'}, ...]}`.
    """
    described = {'bytes_per_step': self._bytes_per_step,
                 'byte_order': sys.byteorder,
                 'fields': [{'path': s.path, 'dtype': s.dtype.name,
                             'shape': list(s.shape), 'offset': s.offset,
                             'nbytes': s.nbytes} for s in self._slots]}
    if self.ids:
      described['writer_ids'] = {'offset': self._fields_bytes,
                                 'nbytes': IDS_BYTES}
    return described

  def pack(self, flat_step: Sequence[np.ndarray]) -> np.ndarray:
    """Packs one step (its fields in `tree.flatten` order) into a byte row.

    The fields must have the spec's dtypes and shapes (the observer's
    validation ensures it); a batch of steps (the same leading batch
    dimensions on every field) packs into one row per step.

    Args:
      flat_step: the step's fields as numpy arrays, `tree.flatten` order.

    Returns:
      `uint8[bytes_per_step]`, or `uint8[*batch, bytes_per_step]`.

    Raises:
      ValueError: if a field's dtype or size differs from the layout (names
        the first such field).
    """
    if len(flat_step) != len(self._slots):
      raise ValueError(f'pack: {len(flat_step)} fields, the spec has '
                       f'{len(self._slots)}.')
    if tuple(v.dtype for v in flat_step) != self._dtypes:
      self._refuse(flat_step)
    lead = flat_step[0].shape[:flat_step[0].ndim - self._first_rank]
    if lead:
      parts = [np.ascontiguousarray(v).reshape(lead + (-1,)).view(np.uint8)
               for v in flat_step]
      if self.ids:
        parts.append(np.zeros(lead + (IDS_BYTES,), np.uint8))
      row = np.concatenate(parts, axis=-1)
    else:  # Bytes joined: 2.6 us a step of 5 scalars, np.concatenate 10.
      parts = [v.tobytes() for v in flat_step]
      if self.ids:
        parts.append(self._ids_zeros)
      row = np.frombuffer(bytearray(b''.join(parts)), np.uint8)
    if row.shape[-1] != self._bytes_per_step:
      self._refuse(flat_step)
    return row

  def stamp_ids(self, rows: np.ndarray, writer_id: int, seq: int) -> None:
    """Writes the writer ids into packed rows (in place).

    Args:
      rows: `uint8[bytes_per_step]` (stream 0), or `uint8[streams,
        bytes_per_step]` (row `i` is stream `i`), from `pack`.
      writer_id: the writer's id, an unsigned 64-bit integer.
      seq: the sequence number of the call that wrote them, below
        `2**SEQ_BITS`.

    Raises:
      ValueError: if the codec has no ids, or a value is out of range.
    """
    if not self.ids:
      raise ValueError('stamp_ids: this codec was made without ids=True.')
    if not 0 <= seq < 1 << SEQ_BITS:
      raise ValueError(f'stamp_ids: seq must be in [0, 2**{SEQ_BITS}), got '
                       f'{seq}.')
    if rows.ndim == 1:
      _IDS.pack_into(rows, self._fields_bytes, writer_id, seq)
      return
    if rows.shape[0] > MAX_STREAMS:
      raise ValueError(f'stamp_ids: at most {MAX_STREAMS} streams, got '
                       f'{rows.shape[0]}.')
    for stream, row in enumerate(rows):
      _IDS.pack_into(row, self._fields_bytes, writer_id,
                     stream << SEQ_BITS | seq)

  def read_ids(self, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray,
                                                 np.ndarray]:
    """The writer ids of packed rows.

    Args:
      rows: `uint8[..., bytes_per_step]`.

    Returns:
      `(writer_id, stream, seq)`, `uint64` arrays of the rows' leading shape.

    Raises:
      ValueError: if the codec has no ids.
    """
    if not self.ids:
      raise ValueError('read_ids: this codec was made without ids=True.')
    raw = np.ascontiguousarray(
        np.asarray(rows, np.uint8)[..., self._fields_bytes:
                                   self._fields_bytes + IDS_BYTES])
    ids = raw.view(WRITER_IDS)
    return (ids[..., 0], ids[..., 1] >> np.uint64(SEQ_BITS),
            ids[..., 1] & np.uint64((1 << SEQ_BITS) - 1))

  def _refuse(self, flat_step: Sequence[np.ndarray]) -> None:
    """Raises a ValueError naming the first field that does not fit."""
    first = flat_step[0]
    lead = first.shape[:first.ndim - self._first_rank]
    for slot, value in zip(self._slots, flat_step):
      if value.dtype != slot.dtype or value.shape != lead + slot.shape:
        raise ValueError(
            f'pack: field {slot.path!r} is {value.dtype}{list(value.shape)}, '
            f'the layout holds {slot.dtype.name}{list(slot.shape)} per step '
            f'(batch shape {list(lead)}).')
    raise ValueError(f'pack: the fields do not make a row of '
                     f'{self._bytes_per_step} bytes.')

  def unpack(self, rows: np.ndarray) -> Any:
    """Decodes packed rows with numpy (for readers outside `tf.data`).

    Args:
      rows: `uint8[..., bytes_per_step]`.

    Returns:
      A nest like the spec of arrays `[..., *field shape]`.
    """
    rows = np.ascontiguousarray(rows, np.uint8)
    lead = rows.shape[:-1]
    fields = [np.ascontiguousarray(rows[..., s.offset:s.offset + s.nbytes])
              .view(s.dtype).reshape(lead + s.shape) for s in self._slots]
    return tree.unflatten_as(self._spec, fields)

  def decode(self, rows: tf.Tensor) -> Any:
    """Decodes packed rows inside TensorFlow (e.g. in `Dataset.map`).

    Args:
      rows: a `uint8` tensor `[..., bytes_per_step]` with a known rank.

    Returns:
      A nest like the spec of tensors `[..., *field shape]` with the spec's
      dtypes.
    """
    # Known leading dimensions stay static (a Learner's batch size).
    lead = (rows.shape[:-1].as_list() if rows.shape[:-1].is_fully_defined()
            else tf.shape(rows)[:-1])
    fields = []
    for slot in self._slots:
      raw = rows[..., slot.offset:slot.offset + slot.nbytes]
      size = slot.dtype.itemsize
      dtype = tf.as_dtype(slot.dtype)
      if dtype == tf.bool:
        value = tf.cast(raw, tf.bool)
      elif size == 1:
        value = raw if dtype == tf.uint8 else tf.bitcast(raw, dtype)
      else:
        grouped = tf.reshape(raw, _shape(lead, (slot.nbytes // size, size)))
        value = tf.bitcast(grouped, dtype)
      fields.append(tf.reshape(value, _shape(lead, slot.shape)))
    return tree.unflatten_as(self._spec, fields)


def _shape(lead: Any, tail: Sequence[int]) -> Any:
  """`lead + tail` as a static list, or a shape tensor if `lead` is one."""
  if isinstance(lead, list):
    return lead + list(tail)
  return tf.concat([lead, tf.constant(list(tail), tf.int32)], 0)


LAYOUTS = ('columns', 'packed')


class Layout:
  """How the fields of a step become the columns Reverb stores, and back.

  Attributes:
    name: 'columns' (one Reverb column per field) or 'packed' (one `uint8`
      column per step, see `StepCodec`).
    data_spec: the spec of one step, as the observer receives and the
      Learner gets it.
    step_spec: what Reverb stores per step: `data_spec` itself, or one
      `uint8[bytes_per_step]` tensor.
    num_columns: Reverb columns per step.
    lookback: cells an item references before its first step (0 here; see
      `frame_stacks.FrameStackedLayout`).
    stacked_field: None here (a frame-stacked layout's stacked field).
    writer_ids: whether each stored step carries its writer ids (packed
      rows made with `ids=True`; see `StepCodec`).
    journals_cells, rebuilds_on_read: False (`protocol.StepLayout`).
    block_step_bytes: bytes of a packed row, a block's step ('packed'; None
      for 'columns', which has no blocks).

  A `protocol.StepLayout`.

  Args:
    name: see above.
    data_spec: see above.
    ids: 'packed' only: rows end with the writer ids.

  Raises:
    ValueError: if the name is unknown, a field does not pack, or `ids` is
      asked of 'columns'.
  """

  def __init__(self, name: str, data_spec: Any, *, ids: bool = False):
    if name not in LAYOUTS:
      raise ValueError(f'layout must be one of {LAYOUTS}, got {name!r}.')
    if ids and name != 'packed':
      raise ValueError(f"writer ids need layout='packed', got {name!r}.")
    self.name = name
    self.data_spec = data_spec
    self.writer_ids = bool(ids)
    self._codec = StepCodec(data_spec, ids=ids) if name == 'packed' else None
    if self._codec is None:
      self.step_spec = data_spec
      self.num_columns = len(tree.flatten(data_spec))
    else:
      self.step_spec = tf.TensorSpec([self._codec.bytes_per_step], tf.uint8,
                                     name='packed')
      self.num_columns = 1
    self.lookback = 0  # Cells an item references before its first step.
    self.stacked_field = None  # No frame stack (`layouts`).
    # Blocks hold packed rows ('columns' has no blocks: `BufferConfig`).
    self.block_step_bytes = self._codec and self._codec.bytes_per_step

  journals_cells = False  # A journal records the call's columns.
  rebuilds_on_read = False  # Decoding is a few reshapes and bitcasts.

  def describe(self) -> Dict[str, Any]:
    """`{'name', ...}`: the layout as a manifest records it (with the byte
    layout of every field when packed)."""
    if self._codec is None:
      return {'name': self.name}
    return {'name': self.name, **self._codec.describe()}

  def columns(self, flat_step: Sequence[np.ndarray]) -> List[np.ndarray]:
    """The Reverb columns of a step (or of a batch of steps).

    Args:
      flat_step: the step's fields in `tree.flatten` order, validated.

    Returns:
      One array per Reverb column, with the fields' leading batch shape.
    """
    if self._codec is None:
      return list(flat_step)
    return [self._codec.pack(flat_step)]

  def stamp_ids(self, columns: List[np.ndarray], writer_id: int,
                seq: int) -> None:
    """Writes the writer ids into a call's `columns()` (in place; see
    `StepCodec.stamp_ids`); nothing without `writer_ids`."""
    if self.writer_ids:
      self._codec.stamp_ids(columns[0], writer_id, seq)

  def read_ids(self, stored: np.ndarray, *, block: bool = False) -> Tuple[
      np.ndarray, np.ndarray, np.ndarray]:
    """The writer ids of stored steps, with numpy.

    Args:
      stored: steps of an item's first column as a checkpoint stores them
        (`uint8[..., bytes_per_step]`; a block holds its rows).
      block: whether `stored` is a block (the same here: rows are rows).

    Returns:
      `(writer_id, stream, seq)` of each step (`StepCodec.read_ids`).

    Raises:
      ValueError: without `writer_ids`.
    """
    del block
    if not self.writer_ids:
      raise ValueError('this layout stores no writer ids.')
    return self._codec.read_ids(stored)

  def encoder(self) -> 'WholeSteps':
    """A new stream's encoder: each step is appended as it is.

    Returns:
      A `WholeSteps`.
    """
    return WholeSteps()

  def block_rows(self, columns: Sequence[np.ndarray]) -> np.ndarray:
    """A call's `columns()` as the rows of blocks: the packed rows.

    Args:
      columns: `[rows]`, `uint8[(num_streams,) bytes_per_step]`.

    Returns:
      The rows.
    """
    return columns[0]

  def block_column(self, rows: np.ndarray, count: int) -> np.ndarray:
    """What Reverb stores for one block: its rows as they are.

    Args:
      rows: `uint8[block_length, bytes_per_step]`.
      count: the rows the block uses (the rest are zero).

    Returns:
      `rows`.
    """
    del count
    return rows

  def block_windows(self, items: tf.data.Dataset, count: int, *,
                    num_steps: int, per_item: int, block_length: int,
                    drop_remainder: bool) -> tf.data.Dataset:
    """Batches of sampled blocks as their windows (one gather per batch).

    Args:
      items: a `reverb.TrajectoryDataset` of a table of packed items.
      count: blocks per batch.
      num_steps: steps per window.
      per_item: windows cut from each block.
      block_length: steps per block.
      drop_remainder: drop the last, partial batch when `items` ends.

    Returns:
      `reverb.ReplaySample`s of `[count * per_item, num_steps, bytes]`
      packed rows (`packed_items.cut_windows`).
    """
    del block_length  # The rows' shape holds it.
    return items.batch(count, drop_remainder).map(
        packed_items.cut_windows(num_steps, per_item))

  def decode(self, stored: Any) -> Any:
    """Stored columns back to the data spec, inside TensorFlow.

    Args:
      stored: a sample's data as Reverb returns it (leading batch and time
        dimensions allowed).

    Returns:
      A nest like `data_spec` with the same leading dimensions.
    """
    return stored if self._codec is None else self._codec.decode(stored)

  def unpack(self, stored: Any) -> Any:
    """Stored columns back to the data spec, with numpy.

    Args:
      stored: a nest like `step_spec` of numpy arrays.

    Returns:
      A nest like `data_spec` of numpy arrays.
    """
    return stored if self._codec is None else self._codec.unpack(stored)

  def stored_fields(self, columns: Sequence[np.ndarray]) -> List[np.ndarray]:
    """A checkpoint item's columns back to the spec's fields, with numpy.

    Args:
      columns: the item's columns as a checkpoint stores them.

    Returns:
      Its fields, flat (`[steps, ...]` each; a block's `[1, block_length,
      ...]`).
    """
    if self._codec is None:
      return list(columns)
    return tree.flatten(self._codec.unpack(columns[0]))


class WholeSteps:
  """The `protocol.StepEncoder` of layouts without a frame stack: each step
  is one Reverb step, its columns as they are."""

  def cells(self, step: Sequence[Any], *, first: bool) -> List[List[Any]]:
    """The Reverb steps of one step.

    Args:
      step: the layout's columns of the step.
      first: unused (a step needs none before it).

    Returns:
      `[step]`.
    """
    del first
    return [step]

  def reset(self) -> None:
    """Nothing to forget."""


DEFAULT_LAYOUT = 'packed'


def default_layout(data_spec: Any) -> str:
  """The layout a new buffer of `data_spec` gets when none is asked for.

  'packed' when every field packs (numbers and booleans of known shape),
  else 'columns'; the reason is logged, so the choice is never silent.

  Args:
    data_spec: the spec of one step.

  Returns:
    'packed' or 'columns'.
  """
  try:
    StepCodec(data_spec)
  except ValueError as e:
    logging.info("New buffers of this spec use layout='columns': %s", e)
    return 'columns'
  return DEFAULT_LAYOUT


def stored_layout(stored: Mapping[str, Any]) -> Dict[str, Any]:
  """The layout a manifest (or a served config) records.

  Args:
    stored: a manifest or `record.build_config` dict.

  Returns:
    Its `Layout.describe()`; `{'name': 'columns'}` for configs written before
    layouts were recorded (every field was its own column then), and a
    `frame_stack` without a codec is 'zlib' (written before zstd).
  """
  layout = dict(stored.get('layout', {'name': 'columns'}))
  if layout.get('frame_stack') is not None:
    layout['frame_stack'] = {'codec': 'zlib', **layout['frame_stack']}
  return layout


def stored_name(stored: Mapping[str, Any]) -> str:
  """The layout name a manifest (or a served config) records.

  Args:
    stored: a manifest or `record.build_config` dict.

  Returns:
    Its layout's name; 'columns' for configs written before layouts were
    recorded (every field was its own column then).
  """
  return stored_layout(stored)['name']
