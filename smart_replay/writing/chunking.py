"""How many steps a writer puts in one Reverb chunk, and keeps referenced.

Longer chunks write and checkpoint faster, but every sampled item ships and
decompresses the whole chunks it references: `auto_chunk_length` picks the
default `chunk_length` from the size of a step, and `keep_alive_steps` the
steps whose cell references a writer keeps for the items it creates.
"""

from typing import Any

import numpy as np

from smart_replay.config import tables as tables_lib
from smart_replay.spec import specs

# Largest chunk the automatic `chunk_length` makes, in steps and in bytes of
# one column.
MAX_AUTO_CHUNK_LENGTH = 32
AUTO_CHUNK_BYTES = 32 * 1024


def auto_chunk_length(data_spec: Any) -> int:
  """The default `chunk_length` for steps of `data_spec`.

  Args:
    data_spec: the spec of one step.

  Returns:
    `MAX_AUTO_CHUNK_LENGTH` steps, fewer when the largest field is so big
    that a chunk of it would exceed `AUTO_CHUNK_BYTES` (at least 1).
  """
  # A string (a frame-stacked layout's blob of a few hundred bytes) counts
  # as a pointer.
  largest = max((8 if leaf.dtype == 'string' else
                 np.dtype(leaf.dtype).itemsize) *
                int(np.prod([d or 1 for d in leaf.shape]))
                for leaf in specs.flatten_spec(data_spec))
  return max(1, min(MAX_AUTO_CHUNK_LENGTH, AUTO_CHUNK_BYTES // max(largest, 1)))


def keep_alive_steps(chunk_length: int, longest_item: int) -> int:
  """The steps a writer keeps referenced: an item is created up to
  `chunk_length - 1` steps after its last step.

  Args:
    chunk_length: steps per chunk.
    longest_item: steps of the longest item of any table.

  Returns:
    `chunk_length + longest_item`.

  Raises:
    ValueError: if that exceeds what Reverb's writer takes.
  """
  keep_alive = chunk_length + longest_item
  if keep_alive > tables_lib.REVERB_MAX_INT:
    raise ValueError(
        f'chunk_length ({chunk_length}) + the longest item ({longest_item} '
        f'steps) is {keep_alive} steps for Reverb\'s writer to keep; Reverb '
        f'0.14 takes at most {tables_lib.REVERB_MAX_INT} (2**31 - 1, a C++ '
        'int32).')
  return keep_alive
