"""Every private or version-specific use of Reverb, in one module.

smart_replay relies on a few details of dm-reverb 0.14.0 that Reverb does not
offer as public API. They live here, and nowhere else, so that moving to
another Reverb version means reading one file:

- `new_trajectory_writer` / `raw_calls`: a writer with a constant chunk length
  driven through its C++ `Append` / `CreateItem`. The public
  `TrajectoryWriter.configure(path, max_chunk_length=)` applies only to
  columns first seen by the Python `append`, which costs a tree walk and a
  history update per step; the C++ calls skip both (see
  `benchmarks/`), so the chunker is set on the C++ writer at creation.
- `pending_counts`: the item counts in the text of a timed-out flush (Reverb
  raises `DeadlineExceededError` without them).
- `set_py_client`: TF-Agents 0.19's `ReverbReplayBuffer` keeps its client in
  the private attribute `_py_client`.
- `rate_limiter_allows`: Reverb 0.14's `RateLimiter::CanInsert` / `CanSample`.
- `MAX_INT` and the checkpoint protos (`schema_pb2`, `checkpoint_pb2`): the
  C++ limits and on-disk format of Reverb 0.14 checkpoints.

Importing this module checks that the installed dm-reverb is the pinned one
and fails with an install hint otherwise.
"""

from importlib import metadata
import re
from typing import Any, Callable, Optional, Tuple

import reverb
from reverb import pybind
from reverb.cc import schema_pb2
from reverb.cc.checkpointing import checkpoint_pb2

__all__ = ['MAX_INT', 'PINNED_REVERB_VERSION', 'check_version',
           'checkpoint_pb2', 'new_trajectory_writer', 'pending_counts',
           'rate_limiter_allows', 'raw_calls', 'schema_pb2', 'set_py_client']

PINNED_REVERB_VERSION = '0.14.0'

# The largest count Reverb 0.14 takes: its pybind layer passes max_size,
# max_times_sampled, min_size_to_sample (and the writer's keep-alive steps,
# at least an item's length) as C++ int32, and refuses 2**31 with a bare
# "incompatible constructor arguments" TypeError.
MAX_INT = 2**31 - 1

# Reverb's own text for a timed-out flush (the `__context__` of the
# DeadlineExceededError it raises).
_PENDING_TEXT = re.compile(r'(\d+) items waiting to be written and (\d+) items '
                           r'awaiting confirmation')


def check_version(installed: Optional[str] = None) -> None:
  """Raises unless the installed dm-reverb is the pinned version.

  Args:
    installed: the version to check; default the installed dm-reverb's.

  Raises:
    ImportError: naming the installed and the pinned version, and how to
      install the pinned one.
  """
  if installed is None:
    try:
      installed = metadata.version('dm-reverb')
    except metadata.PackageNotFoundError:
      installed = 'none (reverb is importable but not installed as dm-reverb)'
  if installed != PINNED_REVERB_VERSION:
    raise ImportError(
        f'smart_replay needs dm-reverb=={PINNED_REVERB_VERSION} (it relies on '
        'details of its checkpoint format, writer and rate limiter); installed '
        f'dm-reverb is {installed}. Install the pinned versions: '
        "pip install -c constraints.txt -e . (or run `make install`).")


check_version()


def new_trajectory_writer(client: reverb.Client, *, chunk_length: int,
                          keep_alive: int) -> reverb.TrajectoryWriter:
  """A validating Reverb `TrajectoryWriter` chunking `chunk_length` steps.

  Args:
    client: the Reverb client to write through.
    chunk_length: steps per chunk of every column.
    keep_alive: steps whose references stay usable for items.

  Returns:
    A `TrajectoryWriter` that checks items against the tables' signatures.
  """
  options = pybind.ConstantChunkerOptions(max_chunk_length=chunk_length,
                                          num_keep_alive_refs=keep_alive)
  return reverb.TrajectoryWriter(client._client.NewTrajectoryWriter(  # pylint: disable=protected-access
      options, True))  # validate_items: Reverb checks items vs the signature.


def raw_calls(writer: reverb.TrajectoryWriter
              ) -> Tuple[Callable[..., Any], Callable[..., Any]]:
  """The C++ writer's `(Append, CreateItem)`.

  `Append(flat_step)` returns one cell reference per column;
  `CreateItem(table, priority, [[refs of a column], ...], squeeze_flags)`
  makes an item of them. Unlike the Python wrapper they keep no per-step
  history: the caller keeps the references it needs.

  Args:
    writer: a writer made by `new_trajectory_writer`.

  Returns:
    `(append, create_item)`.
  """
  inner = writer._writer  # pylint: disable=protected-access
  return inner.Append, inner.CreateItem


def pending_counts(timed_out: BaseException) -> Optional[Tuple[int, int]]:
  """`(unsent, unconfirmed)` items of a writer whose flush timed out.

  Args:
    timed_out: the `DeadlineExceededError` of `flush` / `end_episode`.

  Returns:
    The counts Reverb put in the error's context, or None if it has none.
  """
  counts = _PENDING_TEXT.search(str(timed_out.__context__ or ''))
  return None if counts is None else tuple(map(int, counts.groups()))


def set_py_client(replay_buffer: Any, client: reverb.Client) -> None:
  """Makes `client` the `py_client` of a TF-Agents `ReverbReplayBuffer`.

  Args:
    replay_buffer: a `tf_agents.replay_buffers.ReverbReplayBuffer`.
    client: the client its `py_client` property then returns.
  """
  replay_buffer._py_client = client  # pylint: disable=protected-access


def rate_limiter_allows(limiter: Any, *, size: int) -> Tuple[bool, bool]:
  """`(can_insert, can_sample)` as Reverb 0.14's rate limiter decides now.

  Args:
    limiter: a table's `RateLimiterInfo` (from `Client.server_info()`).
    size: the table's current size.

  Returns:
    Whether one more insert, and one more sample, would go through.
  """
  inserts = limiter.insert_stats.completed
  samples = limiter.sample_stats.completed
  spi = limiter.samples_per_insert
  can_sample = (size >= limiter.min_size_to_sample and
                inserts * spi - samples - 1 >= limiter.min_diff)
  can_insert = (size + 1 <= limiter.min_size_to_sample or
                (inserts + 1) * spi - samples <= limiter.max_diff)
  return bool(can_insert), bool(can_sample)


def stored_signature(table: Any) -> Any:
  """The signature a checkpoint's table records, as Reverb decodes it.

  Args:
    table: a `checkpoint_pb2.PriorityTableCheckpoint`.

  Returns:
    A nest of `tf.TensorSpec`, or None for a table without a signature.
  """
  from tensorflow.python.saved_model import nested_structure_coder  # pylint: disable=g-import-not-at-top
  if not table.HasField('signature'):
    return None
  return nested_structure_coder.decode_proto(table.signature)
