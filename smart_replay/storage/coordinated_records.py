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

Records arrive over the network, so nothing in them is trusted: a record is
checked against a schema (`check_record`: types, sizes, the shard index in
range, an id no later than the server's clock allows) before it is written,
and again when it is read (a record that fails is skipped with a warning).
The server stamps each record with its own write time (`recorded_unix`) and
prunes by that, never by the id a client chose; and a restore never takes a
path from a record: each shard finds its own checkpoint tagged with the id
(`storage.layout`, inside its own `checkpoints/`).
"""

import datetime
import json
import os
import re
import time
from typing import Any, Dict, List, Optional, Set

from absl import logging

from smart_replay import errors
from smart_replay.storage import durable
from smart_replay.storage import checkpoint_folders
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import ownership

RECORDS_DIR = 'coordinated'
# The key of a shard checkpoint's manifest `extra` holding its coordinated id.
EXTRA_KEY = 'coordinated_checkpoint'
# The key marking a checkpoint a client asked for over the network.
REQUESTED_KEY = 'requested_by_client'
# The key marking a checkpoint the manager took on its own, to bound its
# journals (the newest one is kept besides `keep_checkpoints` of each group).
AUTOMATIC_KEY = 'automatic_checkpoint'
AUTOMATIC_GROUP = 'automatic'
KEEP_AUTOMATIC = 1
# Records kept on each shard (the newest by the server's write time).
KEEP_RECORDS = 20
# A record's JSON size, its shards, and how far an id may be ahead of the
# server's clock (clocks of the learner and the shards differ a little).
MAX_RECORD_BYTES = 256 << 10
MAX_SHARDS = 1024
MAX_CLOCK_SKEW_S = 300.0
_ID = re.compile(r'([0-9]{8}T[0-9]{6})([0-9]{0,6})Z-[0-9a-f]{8}')


def check_id(coordinated_id: Any) -> str:
  """Checks a coordinated checkpoint id (`'<UTC time>-<8 hex digits>'`).

  Args:
    coordinated_id: the id.

  Returns:
    The id.

  Raises:
    ValueError: if it is not such an id (names the value).
  """
  if not isinstance(coordinated_id, str) or not _ID.fullmatch(coordinated_id):
    raise ValueError(
        f'a coordinated checkpoint id looks like '
        f"'20261126T061500123456Z-0a1b2c3d', got {coordinated_id!r:.80}.")
  return coordinated_id


def id_time(coordinated_id: str) -> float:
  """The UTC time an id starts with, as a Unix time.

  Args:
    coordinated_id: a valid id (`check_id`).

  Returns:
    Seconds since the epoch.

  Raises:
    ValueError: if the time is not a real date.
  """
  seconds, fraction = _ID.fullmatch(coordinated_id).groups()
  try:
    when = datetime.datetime.strptime(seconds, '%Y%m%dT%H%M%S').replace(
        tzinfo=datetime.timezone.utc)
  except ValueError:
    raise ValueError(f'coordinated checkpoint id {coordinated_id!r} does not '
                     'start with a real UTC time.') from None
  return when.timestamp() + (float(f'0.{fraction}') if fraction else 0.0)


def check_current_id(coordinated_id: Any, *,
                     now: Optional[float] = None) -> str:
  """Checks an id (`check_id`) and that it is no later than the server's
  clock plus `MAX_CLOCK_SKEW_S` (an id of the future would sort newest).

  Args:
    coordinated_id: the id.
    now: the server's clock (default: now).

  Returns:
    The id.

  Raises:
    ValueError: naming the id and the latest time allowed.
  """
  coordinated_id = check_id(coordinated_id)
  now = time.time() if now is None else now
  if id_time(coordinated_id) > now + MAX_CLOCK_SKEW_S:
    clock = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
    _fail('id', coordinated_id, f"no later than this server's clock "
          f'({clock:%Y-%m-%dT%H:%M:%SZ}) plus {MAX_CLOCK_SKEW_S:g} s')
  return coordinated_id


def _fail(what: str, value: Any, expected: str) -> None:
  raise ValueError(f'coordinated record: {what} must be {expected}, got '
                   f'{value!r:.120}.')


def check_record(record: Any, *, now: Optional[float] = None
                 ) -> Dict[str, Any]:
  """Checks a coordinated record against its schema.

  `{'id': str, 'created_utc': str, 'extra': dict, 'shards': [{'address':
  str, 'path': str, 'counts': dict}, ...], 'shard': int}` (`shard`: the
  index of the shard the record is for; `recorded_unix`, the server's write
  time, may be there too). The id must not be later than `now` plus
  `MAX_CLOCK_SKEW_S`, and the JSON at most `MAX_RECORD_BYTES`.

  Args:
    record: the record, as received or read.
    now: the server's clock (default: now).

  Returns:
    The record.

  Raises:
    ValueError: naming the first field that is wrong, its value and what
      was expected.
  """
  if not isinstance(record, dict):
    _fail('the record', record, 'a JSON object')
  try:
    size = len(json.dumps(record, allow_nan=False))
  except (ValueError, RecursionError):
    _fail('the record', '...', 'plain JSON (finite numbers, nested at most '
          'a few hundred levels)')
  if size > MAX_RECORD_BYTES:
    _fail('its size in bytes', size, f'at most {MAX_RECORD_BYTES}')
  now = time.time() if now is None else now
  check_current_id(record.get('id'), now=now)
  for key, kind, expected in (('created_utc', str, 'a string'),
                              ('extra', dict, 'a JSON object')):
    if key in record and not isinstance(record[key], kind):
      _fail(key, record[key], expected)
  shards = record.get('shards')
  if not isinstance(shards, list) or not 0 < len(shards) <= MAX_SHARDS:
    _fail('shards', shards, f'a list of 1 to {MAX_SHARDS} shard entries')
  for k, entry in enumerate(shards):
    if not isinstance(entry, dict):
      _fail(f'shards[{k}]', entry, "an object {'address', 'path', 'counts'}")
    for key, kind, expected in (('address', str, 'a string'),
                                ('path', str, 'a string'),
                                ('counts', dict, 'a JSON object')):
      if not isinstance(entry.get(key), kind):
        _fail(f'shards[{k}].{key}', entry.get(key), expected)
  shard = record.get('shard')
  if (isinstance(shard, bool) or not isinstance(shard, int) or
      not 0 <= shard < len(shards)):
    _fail('shard', shard, f'an index of shards, 0 to {len(shards) - 1}')
  recorded = record.get('recorded_unix', 0.0)
  if (isinstance(recorded, bool) or not isinstance(recorded, (int, float))
      or recorded > now + MAX_CLOCK_SKEW_S):
    _fail('recorded_unix', recorded, "a time no later than this server's "
          'clock allows')
  return record


# The retention group of coordinated checkpoints no record names (yet):
# phase 1 of a save in progress, or of one that never committed. It keeps
# `KEEP_UNCOMMITTED` (the save in progress), so uncommitted saves never
# prune a committed one.
UNCOMMITTED_GROUP = 'coordinated, uncommitted'
KEEP_UNCOMMITTED = 1


def retention_group(manifest: Dict[str, Any],
                    committed: Optional[Set[str]] = None) -> str:
  """Which retention group a checkpoint belongs to (each keeps its newest
  `keep_checkpoints`, so one group's saves never prune another's).

  Args:
    manifest: a checkpoint's manifest.
    committed: the coordinated ids a record names (`recorded_ids`); None:
      count every coordinated checkpoint as committed.

  Returns:
    'coordinated' (tagged with a committed coordinated id),
    `UNCOMMITTED_GROUP` (tagged with an id no record names), 'requested' (a
    client asked for it over the network, `REQUESTED_KEY`),
    `AUTOMATIC_GROUP` (the manager took it to bound its journals,
    `AUTOMATIC_KEY`), or 'own' (the buffer's own: scheduled, final, local
    calls).
  """
  extra = manifest.get('extra') or {}
  if extra.get(EXTRA_KEY):
    if committed is not None and extra[EXTRA_KEY] not in committed:
      return UNCOMMITTED_GROUP
    return 'coordinated'
  if extra.get(AUTOMATIC_KEY):
    return AUTOMATIC_GROUP
  return 'requested' if extra.get(REQUESTED_KEY) else 'own'


def recorded_ids(buffer_dir: str) -> Set[str]:
  """The coordinated ids this shard holds a record of (by file name).

  Args:
    buffer_dir: this shard's buffer directory.

  Returns:
    The ids.
  """
  return {name[:-len('.json')] for name in _names(
      os.path.join(buffer_dir, RECORDS_DIR))}


def tagged_checkpoint(buffer_dir: str, coordinated_id: str) -> Optional[str]:
  """This shard's own checkpoint of a coordinated checkpoint.

  Only `ckpt-N` folders inside `<buffer_dir>/checkpoints/` count, each
  resolved with `realpath` (a link out of the folder is no checkpoint of
  this buffer), and only one whose manifest carries `coordinated_id`.

  Args:
    buffer_dir: this shard's buffer directory.
    coordinated_id: a valid id (`check_id`).

  Returns:
    The checkpoint folder, or None if this shard holds none tagged so.
  """
  root = os.path.realpath(os.path.join(buffer_dir, checkpoint_folders.CHECKPOINTS_DIR))
  if not os.path.isdir(root):
    return None
  for name in sorted(os.listdir(root), reverse=True):
    path = os.path.realpath(os.path.join(root, name))
    if (checkpoint_folders.checkpoint_number(name) is None or
        os.path.dirname(path) != root):
      continue
    try:
      manifest = checkpoint_folders.read_manifest(path)
    except errors.CheckpointCorruptError:
      continue
    if (manifest.get('extra') or {}).get(EXTRA_KEY) == coordinated_id:
      return path
  return None


def write_record(buffer_dir: str, record: Dict[str, Any], *,
                 keep: int = KEEP_RECORDS) -> str:
  """Writes a coordinated checkpoint's record, atomically and durably.

  The record is checked first (`check_record`) and stamped with the
  server's write time (`recorded_unix`); afterwards only the newest `keep`
  records by that time are kept.

  Args:
    buffer_dir: this shard's buffer directory.
    record: `{'id', 'created_utc', 'extra', 'shards': [...], 'shard'}`.
    keep: records to keep.

  Returns:
    The record's path.

  Raises:
    ValueError: if the record does not fit the schema (names the field).
    OSError: if writing fails (e.g. a full disk); no record is left (a
      `.tmp` file may be, which `read_records` ignores).
  """
  now = time.time()
  # Checked as stored, stamp included: a record that fits only without it
  # would be refused by every read.
  record = check_record(dict(record, recorded_unix=now) if isinstance(
      record, dict) else record, now=now)
  folder = ownership.private_dir(os.path.join(buffer_dir, RECORDS_DIR))
  path = os.path.join(folder, f'{record["id"]}.json')
  manifest_lib.write(path, record)  # Temporary file, fsync, rename.
  durable.fsync_dir(folder)
  for old in _by_write_time(folder)[:-keep]:
    durable.remove(os.path.join(folder, old))
  return path


def read_records(buffer_dir: str) -> List[Dict[str, Any]]:
  """This shard's coordinated records, oldest first (by id).

  Args:
    buffer_dir: this shard's buffer directory.

  Returns:
    The records that fit the schema (`check_record`) and whose file name is
    their id; any other is skipped with a warning, never fatal.
  """
  folder = os.path.join(buffer_dir, RECORDS_DIR)
  records = []
  for name in sorted(_names(folder)):
    path = os.path.join(folder, name)
    try:
      with open(path) as f:
        record = check_record(json.load(f))
      if record['id'] != name[:-len('.json')]:
        raise ValueError(f'its id {record["id"]!r} is not its file name')
      records.append(record)
    except (OSError, ValueError, RecursionError) as e:
      _warn_once(path, e)
  return records


# The bad record files already logged, by (path, size, mtime): a file is
# logged once, however often records are listed (only logging uses it).
_WARNED: Dict[Any, None] = {}
_MAX_WARNED = 4096


def _warn_once(path: str, error: Exception) -> None:
  """Logs that a record file is skipped, once per version of the file."""
  try:
    info = os.lstat(path)
    key = (path, info.st_size, info.st_mtime_ns)
  except OSError:
    key = (path, None, None)
  if key in _WARNED:
    return
  if len(_WARNED) >= _MAX_WARNED:
    _WARNED.clear()
  _WARNED[key] = None
  logging.warning('Skipping the coordinated record %s: %s', path, error)


def _by_write_time(folder: str) -> List[str]:
  """Record files, oldest first by the server's write time (`recorded_unix`,
  or for a record written before it was stamped, the file's modification
  time, no later than now); records that do not fit the schema come first,
  so a planted file never outlives a real record."""
  now = time.time()

  def written(name: str) -> float:
    path = os.path.join(folder, name)
    try:
      with open(path) as f:
        record = check_record(json.load(f), now=now)
    except (OSError, ValueError, RecursionError):
      return -1.0
    if 'recorded_unix' in record:
      return float(record['recorded_unix'])
    try:
      return min(os.path.getmtime(path), now)
    except OSError:
      return -1.0
  return sorted(_names(folder), key=lambda name: (written(name), name))


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
  # The newest by the first shard's clock when it stored the record (an id's
  # time is the learner's, and a token holder chooses it); then by id.
  candidates = [r for r in per_shard[0] if r['id'] in common]
  return max(candidates, key=lambda r: (r.get('recorded_unix', 0.0), r['id']))


def _names(folder: str) -> List[str]:
  """The record files in `folder` (none if it does not exist)."""
  if not os.path.isdir(folder):
    return []
  return [n for n in os.listdir(folder)
          if n.endswith('.json') and _ID.fullmatch(n[:-len('.json')])]
