"""Training in epochs: every stored item once per epoch, in shuffled batches."""

from typing import Any, Iterator, Optional, Sequence, Tuple

import numpy as np

from smart_replay.storage import reader as checkpoint_reader
from smart_replay.utils import checks


def num_batches(items: int, batch_size: int, *,
                drop_remainder: bool = False) -> int:
  """How many batches an epoch over `items` items yields.

  Args:
    items: items in the table.
    batch_size: items per batch.
    drop_remainder: count only full batches.

  Returns:
    `ceil(items / batch_size)`, or `floor` with `drop_remainder`.

  Raises:
    ValueError: if `batch_size` is not a positive integer.
  """
  checks.positive('batch_size', batch_size, integer=True)
  return items // batch_size if drop_remainder else -(-items // batch_size)


def batches(items: Sequence[Any], data_spec: Any, *, table: str,
            batch_size: int, seed: Optional[int] = None,
            drop_remainder: bool = False
            ) -> Iterator[Tuple[Any, np.ndarray]]:
  """Shuffled batches of snapshot items, each item exactly once.

  Args:
    items: a table's `CheckpointReader` items (with `columns` and `key`).
    data_spec: the spec of one step.
    table: the table's name, for messages.
    batch_size: items per batch.
    seed: seed of the shuffle (None: a new order each call).
    drop_remainder: leave out the last, smaller batch.

  Returns:
    An iterator of `(trajectory, keys)`: a nest like `data_spec` with numpy
    arrays of shape `[batch, steps, ...]`, and the items' uint64 keys.

  Raises:
    ValueError: if `batch_size` is invalid or the items have different
      lengths.
  """
  checks.positive('batch_size', batch_size, integer=True)
  lengths = sorted({len(item.columns[0]) for item in items})
  if len(lengths) > 1:
    raise ValueError(
        f'table {table!r} holds items of {len(lengths)} lengths '
        f'({lengths[0]}..{lengths[-1]} steps); an epoch stacks items of one '
        'length. Sample episodes of any length with get_dataset().')
  order = np.random.default_rng(seed).permutation(len(items))
  stop = len(items) - len(items) % batch_size if drop_remainder else len(items)

  def generate():
    for begin in range(0, stop, batch_size):
      batch = [items[i] for i in order[begin:begin + batch_size]]
      columns = [np.stack(field) for field in zip(
          *(item.columns for item in batch))]
      yield (checkpoint_reader.unflatten(data_spec, columns),
             np.array([item.key for item in batch], np.uint64))
  return generate()
