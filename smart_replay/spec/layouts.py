"""The layout of a buffer: what `BufferConfig` and a manifest say it is.

`make_layout` builds the `packing.Layout` of a layout name, or the
`FrameStackedLayout` of the packed layout with a `frames.FrameStack`;
`layout_from_manifest` rebuilds the one a manifest records and checks it
against what this machine would build.

`FrameStackedLayout` stores each step as one Reverb string (a zlib blob of
one cell, see `frames`): the packed row of every other field and the step's
new frames. Items reference `lookback` cells before their first step; the
dataset rebuilds the stacks once per batch (`decode`), readers per item
(`unpack`).
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
import tree

from smart_replay.spec import frame_stacks
from smart_replay.spec import frames as frames_lib
from smart_replay.spec import packing
from smart_replay.spec import specs


class FrameStackedLayout:
  """The packed layout of a spec with a stacked pixel field.

  Attributes:
    name: 'packed'.
    data_spec: the spec of one step.
    step_spec: `tf.string` scalar: one blob per step.
    num_columns: 1.
    lookback: cells an item references before its first step.
    stacked_field: the `frames.StackedField`.
    rebuilder: the `frame_stacks.Rebuilder` of blobs.
    cells: the `frames.Cells` the writers make.

  Args:
    data_spec: the spec of one step.
    frame_stack: the `frames.FrameStack` option.

  Raises:
    ValueError: if the option does not fit the spec, or another field does
      not pack (names it).
  """

  name = 'packed'
  num_columns = 1

  def __init__(self, data_spec: Any, frame_stack: frames_lib.FrameStack):
    self.data_spec = data_spec
    self.stacked_field = frames_lib.StackedField(frame_stack, data_spec)
    leaves = tree.flatten(data_spec)
    self._rest = packing.StepCodec(
        [s for i, s in enumerate(leaves) if i != self.stacked_field.index])
    self.row_bytes = self._rest.bytes_per_step
    self.rebuilder = frame_stacks.Rebuilder(self.stacked_field, self.row_bytes)
    self.cells = frames_lib.Cells(self.stacked_field, self.row_bytes)
    self.lookback = self.stacked_field.lookback
    self.step_spec = tf.TensorSpec([], tf.string, name='frames')

  def describe(self) -> Dict[str, Any]:
    """The layout as a manifest records it: the packed rows of the other
    fields and `frame_stack`."""
    return {'name': self.name, **self._rest.describe(),
            'frame_stack': self.stacked_field.option.describe()}

  def columns(self, flat_step: Sequence[np.ndarray]) -> List[np.ndarray]:
    """`[rows, frames]` of a step (or a batch of steps): the packed row of
    the other fields and the stack's frames, oldest first; the writer turns
    them into a cell (`frames.CellEncoder`)."""
    index = self.stacked_field.index
    rows = self._rest.pack(flat_step[:index] + flat_step[index + 1:])
    return [rows, self.stacked_field.frames(flat_step[index])]

  def _with_stack(self, rest: Sequence[Any], stack: Any) -> Any:
    flat = list(rest)
    flat.insert(self.stacked_field.index, stack)
    return tree.unflatten_as(self.data_spec, flat)

  def decode(self, stored: Any) -> Any:
    """Stored cells back to the data spec, inside TensorFlow.

    Args:
      stored: `string[batch, lookback + steps]` blobs of per-window items,
        or `(rows, stacks)` already rebuilt (windows cut from blocks).

    Returns:
      A nest like `data_spec` of `[batch, steps, ...]` tensors.
    """
    if isinstance(stored, tuple):
      rows, stacks = stored
    else:
      rows, stacks = self.rebuilder.window_items(stored)
    rest = tree.flatten(self._rest.decode(rows))
    return self._with_stack(rest, stacks)

  def cut_block(self, blob: tf.Tensor, block_length: int, starts: tf.Tensor,
                length: int):
    """Windows cut from a block, inside TensorFlow.

    Args:
      blob: the block's blob (a scalar string).
      block_length: cells per block.
      starts: `int32[windows]`, each window's first cell.
      length: steps per window.

    Returns:
      `(rows, stacks)`, see `frame_stacks.Rebuilder.block_windows`.
    """
    return self.rebuilder.block_windows(blob, block_length, starts, length)

  def unpack(self, stored: Any) -> Any:
    """A stored item's blobs back to the data spec, with numpy (readers).

    Args:
      stored: the item's blobs: `[lookback + steps]` of one cell each, or
        `[1]` holding a block.

    Returns:
      A nest like `data_spec` of `[steps, ...]` arrays (`[1, cells, ...]`
      for a block, as blocks of packed rows are read).
    """
    block = np.asarray(stored).reshape(-1).shape[0] == 1
    rows, stacks = self.rebuilder.unpack_item(stored)
    rest = tree.flatten(self._rest.unpack(rows))
    if block:
      rest, stacks = [r[None] for r in rest], stacks[None]
    return self._with_stack(rest, stacks)


def make_layout(name: str, data_spec: Any,
                frame_stack: Optional[frames_lib.FrameStack] = None) -> Any:
  """The layout of a buffer.

  Args:
    name: 'packed' or 'columns'.
    data_spec: the spec of one step.
    frame_stack: a stacked pixel field to store once per frame (packed
      layout only), or None.

  Returns:
    A `packing.Layout`, or a `FrameStackedLayout`.

  Raises:
    ValueError: if the name is unknown, a field cannot be stored that way,
      or `frame_stack` is given with another layout than 'packed'.
  """
  if frame_stack is None:
    return packing.Layout(name, data_spec)
  if name != 'packed':
    raise ValueError(f'frame_stack={frame_stack!r} needs layout=\'packed\', '
                     f'got layout={name!r}.')
  return FrameStackedLayout(data_spec, frame_stack)


def stored_frame_stack(stored: Mapping[str, Any]
                       ) -> Optional[frames_lib.FrameStack]:
  """The frame stack a manifest (or a served config) records.

  Args:
    stored: a manifest or `record.build_config` dict.

  Returns:
    Its `FrameStack`, or None (also for manifests written before frame
    stacks existed).
  """
  option = packing.stored_layout(stored).get('frame_stack')
  return None if option is None else frames_lib.FrameStack(**option)


def layout_from_manifest(stored: Mapping[str, Any]) -> Any:
  """The layout a manifest records, checked against this machine.

  Args:
    stored: a manifest or `record.build_config` dict.

  Returns:
    The layout that decodes its checkpoint's items.

  Raises:
    ValueError: if the layout is unknown, or the recorded byte layout is not
      the one this machine would use for the recorded spec (e.g. another
      byte order); names the differing entries.
  """
  layout = make_layout(packing.stored_name(stored),
                       specs.spec_from_json(stored['data_spec']),
                       stored_frame_stack(stored))
  recorded = packing.stored_layout(stored)
  here = layout.describe()
  if recorded != here:
    differing = sorted(k for k in set(recorded) | set(here)
                       if recorded.get(k) != here.get(k))
    raise ValueError(
        f'the manifest records a {layout.name!r} layout that differs from '
        f'the one this machine builds for its spec in {differing} (recorded '
        f'{ {k: recorded.get(k) for k in differing} }, here '
        f'{ {k: here.get(k) for k in differing} }).')
  return layout
