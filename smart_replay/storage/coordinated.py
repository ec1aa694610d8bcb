"""Records of coordinated checkpoints of a sharded buffer, on each shard's disk.

A coordinated checkpoint of a buffer sharded over N servers is saved in two
phases (`backends.sharded.ShardedBackend.checkpoint`):

1. every shard writes an ordinary checkpoint whose manifest carries the
   coordinated id (`extra[EXTRA_KEY]`);
2. once all have, one record, `{'id', 'created_utc', 'shards': [{'address',
   'path', 'counts'}, ...]}`, naming every shard's checkpoint and counts, is
   written to every shard's `<buffer>/coordinated/<id>.json` (atomically and
   durably: temporary file, fsync, rename, fsync of the folder).

A coordinated checkpoint is complete when its record is on every shard. A
save interrupted anywhere before the last record is written (a killed
learner, a shard that died) is half-finished: the shards' checkpoints of it
are ordinary checkpoints, and a restore ignores it.

Each shard keeps its newest `keep` coordinated checkpoints apart from its
scheduled ones (`store.CheckpointStore.prune`), so scheduled saves cannot
prune a checkpoint a record names.
"""

import json
import os
import re
from typing import Any, Dict, List, Optional

from absl import logging

from smart_replay.storage import durable
from smart_replay.storage import manifest as manifest_lib

RECORDS_DIR = 'coordinated'
# The key of a shard checkpoint's manifest `extra` holding its coordinated id.
EXTRA_KEY = 'coordinated_checkpoint'
# Records kept on each shard (the newest); older ones are deleted.
KEEP_RECORDS = 20
_ID = re.compile(r'^\d{8}T\d{6}\d*Z-[0-9a-f]{8}$')


def check_id(coordinated_id: Any) -> str:
  """Checks a coordinated checkpoint id (`'<UTC time>-<8 hex digits>'`).

  Args:
    coordinated_id: the id.

  Returns:
    The id.

  Raises:
    ValueError: if it is not such an id (names the value).
  """
  if not isinstance(coordinated_id, str) or not _ID.match(coordinated_id):
    raise ValueError(
        f'a coordinated checkpoint id looks like '
        f"'20261126T061500123456Z-0a1b2c3d', got {coordinated_id!r}.")
  return coordinated_id


def is_coordinated(manifest: Dict[str, Any]) -> bool:
  """Whether a checkpoint's manifest belongs to a coordinated checkpoint.

  Args:
    manifest: a checkpoint's manifest.

  Returns:
    True if its `extra` carries a coordinated id.
  """
  return bool((manifest.get('extra') or {}).get(EXTRA_KEY))


def write_record(buffer_dir: str, record: Dict[str, Any], *,
                 keep: int = KEEP_RECORDS) -> str:
  """Writes a coordinated checkpoint's record, atomically and durably.

  Args:
    buffer_dir: this shard's buffer directory.
    record: `{'id', 'created_utc', 'shards': [...]}`.
    keep: records to keep; older ones are deleted afterwards.

  Returns:
    The record's path.

  Raises:
    ValueError: if the record has no valid id or no shards.
    OSError: if writing fails (e.g. a full disk); no record is left (a
      `.tmp` file may be, which `read_records` ignores).
  """
  coordinated_id = check_id(record.get('id'))
  if not record.get('shards'):
    raise ValueError(f'coordinated record {coordinated_id} names no shards: '
                     f'{record!r}.')
  folder = os.path.join(buffer_dir, RECORDS_DIR)
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, f'{coordinated_id}.json')
  manifest_lib.write(path, record)  # Temporary file, fsync, rename.
  durable.fsync_dir(folder)
  for old in sorted(_names(folder))[:-keep]:
    durable.remove(os.path.join(folder, old))
  return path


def read_records(buffer_dir: str) -> List[Dict[str, Any]]:
  """This shard's coordinated records, oldest first.

  Args:
    buffer_dir: this shard's buffer directory.

  Returns:
    The records; an unreadable one is skipped with a warning (a record is
    renamed into place whole, so this means the disk damaged it).
  """
  folder = os.path.join(buffer_dir, RECORDS_DIR)
  records = []
  for name in sorted(_names(folder)):
    try:
      with open(os.path.join(folder, name)) as f:
        records.append(json.load(f))
    except (OSError, ValueError) as e:
      logging.warning('Skipping the unreadable coordinated record %s: %s',
                      os.path.join(folder, name), e)
  return records


def newest_common(per_shard: List[List[Dict[str, Any]]],
                  usable: Optional[List[List[str]]] = None
                  ) -> Optional[Dict[str, Any]]:
  """The newest coordinated checkpoint recorded on every shard.

  Args:
    per_shard: each shard's records (`read_records`).
    usable: per shard, the ids whose checkpoint on that shard verifies;
      None: every recorded one.

  Returns:
    The newest record whose id every shard holds (and can load), or None.
  """
  if not per_shard:
    return None
  common = set.intersection(*[{r['id'] for r in records}
                              for records in per_shard])
  if usable is not None:
    common &= set.intersection(*[set(ids) for ids in usable])
  if not common:
    return None
  newest = max(common)  # Ids start with the UTC time.
  return next(r for r in per_shard[0] if r['id'] == newest)


def _names(folder: str) -> List[str]:
  """The record files in `folder` (none if it does not exist)."""
  if not os.path.isdir(folder):
    return []
  return [n for n in os.listdir(folder)
          if n.endswith('.json') and _ID.match(n[:-len('.json')])]
