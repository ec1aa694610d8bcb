"""Coordinated checkpoints of a sharded buffer, from the client's side.

`save` runs the two phases of `storage.coordinated` over the shards' control
channels: every shard writes a checkpoint tagged with one new id (in
parallel); then the record naming each shard's checkpoint and counts is
written to every shard, and only then does `save` return. `restore` finds
the newest coordinated checkpoint recorded on every shard whose checkpoint
each shard still holds, and has each shard restore its part in place.
"""

import concurrent.futures
import datetime
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

from absl import logging

from smart_replay import errors
from smart_replay.storage import coordinated_records as records_lib
from smart_replay.control import protocol

# Where a shard's manifest, and the whole buffer's loaded manifest, keep it.
EXTRA_KEY = records_lib.EXTRA_KEY
# The steps of `save`, in order (`_fault_point` is called after each).
STEPS = ('shards_saved', 'recorded_on_first', 'recorded_on_all')

# call(shard index, control method, arguments) -> the answer.
Call = Callable[[int, str, Dict[str, Any]], Any]


def new_id() -> str:
  """A new coordinated checkpoint id: the UTC time, then 8 random hex digits
  (ids sort by time)."""
  now = datetime.datetime.now(datetime.timezone.utc)
  return f'{now:%Y%m%dT%H%M%S%f}Z-{uuid.uuid4().hex[:8]}'


def _on_every_shard(call: Call, addresses: Sequence[str], method: str,
                    args: Callable[[int], Dict[str, Any]], what: str, *,
                    shards: Optional[Sequence[int]] = None) -> List[Any]:
  """`call`s `method` on every shard (or those of `shards`) in parallel;
  raises naming each shard that failed (after all answered or failed)."""
  shards = range(len(addresses)) if shards is None else shards
  if not shards:
    return []
  with concurrent.futures.ThreadPoolExecutor(len(shards)) as pool:
    futures = [pool.submit(call, k, method, args(k)) for k in shards]
    answers, failures = [], []
    for k, future in zip(shards, futures):
      try:
        answers.append(future.result())
      except errors.SmartReplayError as e:
        failures.append((k, e))
  if failures:
    raise errors.CheckpointWriteError(
        f'{what} failed on {len(failures)} of {len(shards)} shard(s): '
        + '; '.join(f'shard {k} ({addresses[k]}): {type(e).__name__}: {e}'
                    for k, e in failures)) from failures[0][1]
  return answers


def save(call: Call, addresses: Sequence[str], *,
         extra: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """Writes one coordinated checkpoint of every shard.

  Args:
    call: calls a control method on shard k.
    addresses: the shards' addresses (in shard order).
    extra: user metadata, kept in every shard's manifest and the record.

  Returns:
    The record: `{'id', 'created_utc', 'extra', 'shards': [{'address',
    'path', 'counts'}]}`.

  Raises:
    CheckpointWriteError: if a shard did not save or record it (names each
      such shard); the coordinated checkpoint is then incomplete, and a
      restore ignores it.
  """
  coordinated_id = new_id()
  extra = dict(extra or {})
  saved = _on_every_shard(
      call, addresses, protocol.COORDINATED_SAVE,
      lambda k: {'id': coordinated_id, 'extra': extra},
      f'coordinated checkpoint {coordinated_id}')
  _fault_point('shards_saved')
  record = {'id': coordinated_id, 'extra': extra,
            'created_utc': datetime.datetime.now(
                datetime.timezone.utc).isoformat(timespec='seconds'),
            'shards': [{'address': address, 'path': answer['path'],
                        'counts': answer['counts']}
                       for address, answer in zip(addresses, saved)]}
  # The first shard's record, then the others': a test kills in between.
  for shards in ([0], range(1, len(addresses))):
    _on_every_shard(call, addresses, protocol.COORDINATED_COMMIT,
                    lambda k: {'record': record, 'shard': k},
                    f'recording coordinated checkpoint {coordinated_id}',
                    shards=shards)
    _fault_point('recorded_on_first' if shards == [0] else
                 'recorded_on_all')
  logging.info('Coordinated checkpoint %s of %d shards: %s', coordinated_id,
               len(addresses), [s['path'] for s in record['shards']])
  return record


def restore(call: Call, addresses: Sequence[str],
            coordinated_id: Optional[str] = None) -> Dict[str, Any]:
  """Brings every shard back to one coordinated checkpoint.

  Args:
    call: calls a control method on shard k.
    addresses: the shards' addresses (in shard order).
    coordinated_id: the checkpoint to restore; None: the newest one that is
      recorded on every shard and whose checkpoints every shard still holds.

  Returns:
    The restored record.

  Raises:
    CheckpointNotFoundError: if no such coordinated checkpoint exists (or
      `coordinated_id` is not complete); says what each shard holds.
    CheckpointWriteError: if a shard failed to restore (names it).
  """
  if coordinated_id is not None:
    records_lib.check_id(coordinated_id)
  listed = _on_every_shard(call, addresses, protocol.COORDINATED_LIST,
                           lambda k: {}, 'listing coordinated checkpoints')
  held = [answer['records'] for answer in listed]
  if coordinated_id is not None:
    held = [[r for r in records if r['id'] == coordinated_id]
            for records in held]
  record = records_lib.newest_common(held, [a['usable'] for a in listed])
  if record is None:
    what = '; '.join(f'shard {k} ({address}): recorded '
                     f'{[r["id"] for r in answer["records"]]}, loadable '
                     f'{answer["usable"]}'
                     for k, (address, answer) in enumerate(zip(addresses,
                                                               listed)))
    wanted = (f'coordinated checkpoint {coordinated_id}' if coordinated_id
              else 'coordinated checkpoint')
    raise errors.CheckpointNotFoundError(
        f'no complete {wanted} on all {len(addresses)} shards (recorded on '
        f'every shard, its checkpoint still on each): {what}.')
  _on_every_shard(call, addresses, protocol.COORDINATED_RESTORE,
                  lambda k: {'id': record['id']},
                  f'restoring coordinated checkpoint {record["id"]}')
  logging.info('Every shard restored coordinated checkpoint %s (%s).',
               record['id'], record['created_utc'])
  return record


def as_manifest(record: Dict[str, Any]) -> Dict[str, Any]:
  """The counts of a coordinated checkpoint as one manifest of the whole
  buffer: tables' counts summed (their largest priority: the largest), the
  user's `extra`, and the record under `EXTRA_KEY`.

  Args:
    record: a coordinated record.

  Returns:
    `{'counts': {'env_steps', 'episodes', 'tables'}, 'extra', ...}`.
  """
  tables: Dict[str, Dict[str, Any]] = {}
  for shard in record['shards']:
    for name, counts in shard['counts'].get('tables', {}).items():
      held = tables.setdefault(name, {})
      for key, value in counts.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
          merge = max if key == 'max_priority' else (lambda a, b: a + b)
          held[key] = value if key not in held else merge(held[key], value)
  total = lambda key: sum(s['counts'].get(key, 0) for s in record['shards'])
  return {'counts': {'env_steps': total('env_steps'),
                     'episodes': total('episodes'), 'tables': tables},
          'extra': record.get('extra') or {},
          EXTRA_KEY: record}


def _fault_point(step: str) -> None:
  """A named step of `save` (`STEPS`). Does nothing; durability tests
  replace it to kill the process at exactly this step."""
  del step
