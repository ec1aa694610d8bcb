"""Sources: one stream of items from one table on one server.

A dataset samples one or more sources: the buffer's own table, the shards
of a sharded buffer (one table on each server) and a read-only starter's
table. Each source is a `reverb.TrajectoryDataset` of its table, started
again after its rate-limiter timeout, turned into chunks of windows
(`windows.Windows`) where it is sampled. Its sampling weight within its
group (the buffer it belongs to, `ReplayInfo.source`) is its *mass*: the
table's size (uniform) or its sum of `priority ** alpha` (prioritized), as
one big table over the group's shards would weigh it.
"""

import dataclasses
from typing import Any, Optional

import reverb
import tensorflow as tf

from smart_replay.config import tables as tables_lib
from smart_replay.sampling import windows as windows_lib


@dataclasses.dataclass(frozen=True)
class Source:
  """One table on one server, and where its elements go.

  Attributes:
    address: 'host:port' of the Reverb server.
    table: the table's resolved `TableConfig`.
    group: the `ReplayInfo.source` of its elements (`ONLINE` or `STARTER`).
    shard: its index among its group's sources (`ReplayInfo.shard`).
    size: items in the table when the dataset is made (the start of its
      mass; `None`: 1 until a sample says more).
    watched: whether its server can go down or restart while sampled (a
      shard of a sharded buffer): the batcher then takes the manager's
      signals (`Batcher.source_down`, `source_up`) instead of waiting on it.
  """
  address: str
  table: tables_lib.TableConfig
  group: int
  shard: int = 0
  size: Optional[int] = None
  watched: bool = False

  def describe(self) -> str:
    """'Reverb table `name` at host:port' (with the shard, when sharded).

    Backquotes, not quotes: TensorFlow escapes quotes in the messages of
    errors raised inside the graph.
    """
    shard = f' (shard {self.shard})' if self.watched else ''
    return f'Reverb table `{self.table.name}` at {self.address}{shard}'

  @property
  def ordered(self) -> bool:
    """Whether its items must be sampled in order (FIFO/LIFO) or are deleted
    by sampling: one Reverb worker, and no prefetch beyond a batch."""
    return (self.table.sampler in ('fifo', 'lifo') or
            self.table.max_times_sampled > 0)

  def items(self, windows: windows_lib.Windows, *, in_flight: int,
            timeout_s: float) -> tf.data.Dataset:
    """One Reverb stream of the table's items; it ends only when no sample
    was allowed for `timeout_s`.

    Args:
      windows: how the table's items are read (their dtypes and shapes).
      in_flight: samples each Reverb worker requests ahead.
      timeout_s: Reverb's rate-limiter timeout.

    Returns:
      A `reverb.TrajectoryDataset`.
    """
    return reverb.TrajectoryDataset(
        self.address, self.table.name, windows.dtypes, windows.shapes,
        max_in_flight_samples_per_worker=in_flight,
        num_workers_per_iterator=1 if self.ordered else 2,
        rate_limiter_timeout_ms=int(timeout_s * 1000))

  def timeout_message(self, timeout_s: float) -> str:
    """What a sample that waited `timeout_s` on this source raises.

    Args:
      timeout_s: the timeout that expired.

    Returns:
      'WaitTimeoutError: Timed out after ... waiting to sample from Reverb
      table ...', with what holds sampling back and what to do.
    """
    table = self.table
    if table.samples_per_insert is not None:
      rule = (f'sampling needs at least min_size_to_sample='
              f'{table.min_size_to_sample} items in it, and its '
              f'samples_per_insert={table.samples_per_insert:g} rate limiter '
              f'lets sampling run at most error_buffer={table.error_buffer:g}'
              ' samples ahead of the inserts')
    else:
      rule = (f'sampling needs at least min_size_to_sample='
              f'{table.min_size_to_sample} items in it')
    return (f'WaitTimeoutError: Timed out after {timeout_s:g} s waiting to '
            f'sample from {self.describe()}: nothing could be sampled in that'
            f' time; {rule} (stats() shows what it holds). Write '
            'more data through the observer (and flush it), or raise '
            'sample_timeout_s. The same iterator samples again on the next '
            'call.')


def mass_of(info: Any, table: tables_lib.TableConfig) -> tf.Tensor:
  """What each sample says of its table's mass (float64, per sample).

  Args:
    info: Reverb's `SampleInfo` of the samples (per sample).
    table: the sampled table's config.

  Returns:
    The table's size (uniform tables), or its sum of `priority ** alpha`,
    `priority ** alpha / probability` (prioritized).
  """
  if not table.prioritized:
    return tf.cast(info.table_size, tf.float64)
  return (tf.pow(tf.cast(info.priority, tf.float64),
                 float(table.priority_exponent)) /
          tf.cast(info.probability, tf.float64))
