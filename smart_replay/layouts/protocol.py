"""What every layout supplies: `StepLayout`, the one protocol of formats.

A layout owns its format in both directions, so that the write path
(`writing`), the read path (`sampling`) and the checkpoint reader
(`storage.reader`) call the same methods whatever the format and never ask
which one it is:

* a step: `columns` (the Reverb columns of a call's steps), `stamp_ids` and
  `read_ids` (the writer ids each stored step carries), `encoder` (how a
  stream turns a step into the Reverb steps it appends: the step itself, or
  the cells of a frame stack), `journals_cells` (whether a journal records
  those Reverb steps or the call's columns);
* a block of packed items: `block_step_bytes`, `block_rows` and
  `block_column` on the write side, `block_windows` on the read side;
* reading: `decode` (in TensorFlow), `stored_fields` (with numpy, a
  checkpoint's item), `rebuilds_on_read` (whether decoding is heavy enough
  to run in parallel).

The layouts are `packed_steps.Layout` ('columns' and 'packed') and
`frame_stacks.FrameStackedLayout`.
"""

from typing import (Any, Dict, List, Optional, Protocol, Sequence, Tuple,
                    runtime_checkable)

import numpy as np
import tensorflow as tf


class StepEncoder(Protocol):
  """How one stream turns each step into the Reverb steps it appends."""

  def cells(self, step: Sequence[Any], *, first: bool) -> List[List[Any]]:
    """The Reverb steps to append for one step.

    Args:
      step: the layout's columns of the step (`StepLayout.columns`).
      first: whether it is the first step the stream appends since it
        started or `reset()`.

    Returns:
      `[columns of a Reverb step, ...]`.
    """

  def reset(self) -> None:
    """Forgets the steps before: the next one starts a stream."""


@runtime_checkable
class StepLayout(Protocol):
  """How a buffer stores its steps in Reverb, written and read back.

  Attributes:
    name: 'columns' or 'packed', as the manifest records it.
    data_spec: the spec of one step, as observers take it and the Learner
      gets it.
    step_spec: what Reverb stores per step.
    num_columns: Reverb columns per step.
    lookback: Reverb steps an item references before its first step.
    writer_ids: whether each stored step carries its writer ids.
    journals_cells: whether a journal records the Reverb steps a stream
      appends (`encoder`) rather than the call's columns.
    rebuilds_on_read: whether `decode` rebuilds data (worth running in
      parallel).
    block_step_bytes: bytes of one step in a block of packed items (None
      for a layout without blocks).
  """

  name: str
  data_spec: Any
  step_spec: Any
  num_columns: int
  lookback: int
  writer_ids: bool
  journals_cells: bool
  rebuilds_on_read: bool
  block_step_bytes: Optional[int]

  def describe(self) -> Dict[str, Any]:
    """The layout as a manifest records it."""

  def columns(self, flat_step: Sequence[np.ndarray]) -> List[np.ndarray]:
    """The columns of a step (or of a batch of steps), validated fields in
    `tree.flatten` order in."""

  def stamp_ids(self, columns: List[np.ndarray], writer_id: int,
                seq: int) -> None:
    """Writes the writer ids into a call's `columns()`, in place."""

  def read_ids(self, stored: Any, *, block: bool) -> Tuple[
      np.ndarray, np.ndarray, np.ndarray]:
    """`(writer_id, stream, seq)` of each stored step of an item."""

  def encoder(self) -> StepEncoder:
    """A new stream's `StepEncoder`."""

  def block_rows(self, columns: Sequence[np.ndarray]) -> np.ndarray:
    """A call's `columns()` as the rows of blocks, `uint8[...,
    block_step_bytes]`."""

  def block_column(self, rows: np.ndarray, count: int) -> np.ndarray:
    """What Reverb stores for one block of `rows`, `count` of them used."""

  def block_windows(self, items: tf.data.Dataset, count: int, *,
                    num_steps: int, per_item: int, block_length: int,
                    drop_remainder: bool) -> tf.data.Dataset:
    """Batches of `count` sampled blocks as `per_item` windows of
    `num_steps` steps each (`reverb.ReplaySample`s, data for `decode`)."""

  def decode(self, stored: Any) -> Any:
    """Sampled data back to the data spec, inside TensorFlow."""

  def stored_fields(self, columns: Sequence[np.ndarray]) -> List[np.ndarray]:
    """A checkpoint item's columns back to the spec's fields, flat, with
    numpy."""
