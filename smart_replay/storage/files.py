"""Reading Reverb checkpoint folders without a server.

A Reverb 0.14 checkpoint is a folder holding `tables.tfrecord`,
`items.tfrecord` and `chunks.tfrecord` (ZLIB-compressed TFRecords of the protos
in `reverb.cc.checkpointing.checkpoint_pb2` / `reverb.cc.schema_pb2`) and an
empty `DONE` marker written last. This module checks such a folder for
completeness, fingerprints its files and counts its items per table.
"""

import collections
import hashlib
import os
from typing import Dict, List, NamedTuple, Optional

import numpy as np
import tensorflow as tf

from smart_replay import _reverb_internal as reverb_internal

DATA_FILES = ('tables.tfrecord', 'items.tfrecord', 'chunks.tfrecord')
DONE_FILE = 'DONE'
_COMPRESSION = 'ZLIB'
# Records counted per step of `record_counts` (one step per record is slow).
_COUNT_BATCH = 4096


def records(path: str, file_name: str, proto_class):
  """Yields the protos stored in one of a checkpoint's record files.

  Args:
    path: a checkpoint folder.
    file_name: one of `DATA_FILES`.
    proto_class: the proto each record holds (e.g.
      `reverb_internal.schema_pb2.PrioritizedItem` for `items.tfrecord`).

  Yields:
    One parsed `proto_class` per record, in file order.

  Raises:
    tf.errors.DataLossError: if the file is damaged.
  """
  # Batched: each eager next() leaks a Python object per output tensor in
  # TF 2.15 on Python 3.11 (tensorflow#62551), so one per record would leak
  # about 1 MB per 20,000 items read.
  dataset = tf.data.TFRecordDataset(os.path.join(path, file_name),
                                    compression_type=_COMPRESSION)
  for batch in dataset.batch(_COUNT_BATCH).as_numpy_iterator():
    for record in batch:
      yield proto_class.FromString(record)


def missing_files(path: str) -> List[str]:
  """Lists the Reverb files a complete checkpoint needs but `path` lacks.

  Args:
    path: a checkpoint folder.

  Returns:
    Names of missing files (empty when the folder is complete).
  """
  return [name for name in DATA_FILES + (DONE_FILE,)
          if not os.path.isfile(os.path.join(path, name))]


def is_reverb_checkpoint(path: str) -> bool:
  """Tells whether `path` is a complete Reverb checkpoint folder.

  Args:
    path: any path.

  Returns:
    True if it is a folder with a `DONE` marker and all Reverb data files.
  """
  return os.path.isdir(path) and not missing_files(path)


def file_digests(path: str) -> Dict[str, dict]:
  """Fingerprints the data files of a checkpoint.

  Args:
    path: a complete checkpoint folder.

  Returns:
    `{file_name: {'bytes': size, 'sha256': hex digest}}` for each data file.
  """
  digests = {}
  for name in DATA_FILES:
    sha = hashlib.sha256()
    with open(os.path.join(path, name), 'rb') as f:
      for block in iter(lambda: f.read(1 << 20), b''):
        sha.update(block)
    digests[name] = {'bytes': os.path.getsize(os.path.join(path, name)),
                     'sha256': sha.hexdigest()}
  return digests


def digest_mismatches(path: str, expected: Dict[str, dict]) -> List[str]:
  """Compares a checkpoint's files with the digests recorded for them.

  Args:
    path: a checkpoint folder.
    expected: what `file_digests` returned when the checkpoint was written.

  Returns:
    One readable line per missing or changed file (empty when all match).
  """
  problems = [f'{name} is missing' for name in missing_files(path)]
  if problems:
    return problems
  actual = file_digests(path)
  for name, want in expected.items():
    got = actual.get(name)
    if got is None:
      problems.append(f'{name} is missing')
    elif got['bytes'] != want['bytes']:
      problems.append(f'{name} has {got["bytes"]} bytes, expected '
                      f'{want["bytes"]}')
    elif got['sha256'] != want['sha256']:
      problems.append(f'{name} content changed (sha256 {got["sha256"][:12]}…, '
                      f'expected {want["sha256"][:12]}…)')
  return problems


class ItemRecord(NamedTuple):
  """One item of a checkpoint, without its data."""
  table: str
  key: int
  priority: float
  times_sampled: int


def read_items(path: str) -> List[ItemRecord]:
  """Lists the items stored in a checkpoint, reading its files.

  Args:
    path: a complete checkpoint folder.

  Returns:
    One `ItemRecord` per stored item, in file order.

  Raises:
    tf.errors.DataLossError: if `items.tfrecord` is damaged.
  """
  return [ItemRecord(item.table, item.key, item.priority, item.times_sampled)
          for item in records(path, 'items.tfrecord',
                              reverb_internal.schema_pb2.PrioritizedItem)]


def count_items(path: str) -> Dict[str, int]:
  """Counts the items stored per table in a checkpoint, reading its files.

  Args:
    path: a complete checkpoint folder.

  Returns:
    `{table_name: number_of_items}`.

  Raises:
    tf.errors.DataLossError: if `items.tfrecord` is damaged.
  """
  return dict(collections.Counter(item.table for item in read_items(path)))


def record_counts(path: str) -> Dict[str, int]:
  """Reads every record of a checkpoint's data files and counts them.

  Reading to the end checks each record's CRC and the end of each
  compressed stream, so a truncated file fails here.

  Args:
    path: a complete checkpoint folder.

  Returns:
    `{file_name: number_of_records}` for each of `DATA_FILES`.

  Raises:
    tf.errors.OpError: (e.g. `DataLossError`) if a file is damaged or
      truncated.
  """
  return {name: int(_count_records(os.path.join(path, name)))
          for name in DATA_FILES}


@tf.function(input_signature=[tf.TensorSpec([], tf.string)])
def _count_records(file_path: tf.Tensor) -> tf.Tensor:
  """Records in one compressed TFRecord file.

  Traced once per process: an eager `Dataset.reduce` traces a new function
  on every call, and TensorFlow keeps every traced function (about 0.4 MB
  per checkpoint, measured by scripts/soak.py).
  """
  def count(total, batch):
    return total + tf.size(batch, out_type=tf.int64)
  return tf.data.TFRecordDataset(file_path, compression_type=_COMPRESSION
                                 ).batch(_COUNT_BATCH).reduce(np.int64(0), count)


def written_problems(path: str, items: Dict[str, Optional[int]]) -> List[str]:
  """Checks that a folder Reverb just wrote holds what the server held.

  Reverb 0.14 reports some failed writes as success: on a full disk it can
  leave empty or truncated files beside a `DONE` marker (seen on a tmpfs),
  so a save is checked before it counts.

  Args:
    path: the folder `Client.checkpoint()` returned.
    items: `{table_name: items it held during the save}`, or None for a
      table whose size changed meanwhile (only its presence is checked).

  Returns:
    One readable line per problem (empty when the folder is complete).
  """
  try:
    counts = record_counts(path)
    tables = set(read_table_counters(path))
  except tf.errors.OpError as e:
    return [f'its files cannot be read to the end ({e.message})']
  problems = []
  if tables != set(items):
    problems.append(f'tables.tfrecord holds tables {sorted(tables)}, '
                    f'expected {sorted(items)}')
  if None not in items.values() and (
      counts['items.tfrecord'] != sum(items.values())):
    problems.append(f"items.tfrecord holds {counts['items.tfrecord']} items, "
                    f'the tables held {sum(items.values())}')
  if counts['items.tfrecord'] and not counts['chunks.tfrecord']:
    problems.append('chunks.tfrecord holds no data for its items')
  return problems


def read_table_counters(path: str) -> Dict[str, Dict[str, int]]:
  """Reads each table's rate-limiter counters stored in a checkpoint.

  Reverb restores them with the table, so comparing them with a restored
  server's counters tells whether clients already inserted or sampled.

  Args:
    path: a complete checkpoint folder.

  Returns:
    `{table_name: {'inserts': n, 'samples': n, 'deletes': n}}`.

  Raises:
    tf.errors.DataLossError: if `tables.tfrecord` is damaged.
  """
  counters = {}
  for table in records(path, 'tables.tfrecord',
                       reverb_internal.checkpoint_pb2.PriorityTableCheckpoint):
    limiter = table.rate_limiter
    counters[table.table_name] = {'inserts': limiter.insert_count,
                                  'samples': limiter.sample_count,
                                  'deletes': limiter.delete_count}
  return counters
