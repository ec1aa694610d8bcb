"""A shard's part in coordinated checkpoints of a sharded buffer.

The control methods a `ReplayServer` adds for `backends.sharded` (the
protocol is in `storage.coordinated`):

* 'coordinated_save' `{id, extra}`: phase 1, writes a checkpoint tagged
  with the coordinated id; answers its path and counts;
* 'coordinated_commit' `{record, shard}`: phase 2, writes the record;
* 'coordinated_list': this shard's records, and the ids whose checkpoint is
  still here;
* 'coordinated_restore' `{id}`: restores this shard's checkpoint of that
  coordinated checkpoint in place (`ReplayServer.reload`): same ports, a new
  server instance, so connected writers count what they lose.
"""

import os
from typing import Any, Dict, List, Protocol

from smart_replay import errors
from smart_replay.manager import facade as manager_lib
from smart_replay.server import control as control_lib
from smart_replay.storage import coordinated
from smart_replay.storage import layout


class Shard(Protocol):
  """What the handlers need of a `ReplayServer`."""

  @property
  def manager(self) -> manager_lib.ReplayBufferManager:
    """The served buffer's manager (it changes at a reload)."""

  def checkpoint(self, *, extra: Any = None, reason: str = '') -> str:
    """Writes a checkpoint now; returns its folder."""

  def reload(self, path: str, *, reason: str) -> str:
    """Restores checkpoint `path` in place; returns the new checkpoint."""


def _own_entry(record: Dict[str, Any]) -> Dict[str, Any]:
  """This shard's entry of a record (the `shard` index it was written with)."""
  return record['shards'][record['shard']]


def _still_here(record: Dict[str, Any]) -> bool:
  """Whether this shard's checkpoint of `record` is here and tagged with its
  id (its files are verified when it is loaded)."""
  path = _own_entry(record)['path']
  try:
    manifest = layout.read_manifest(path)
  except errors.CheckpointCorruptError:
    return False
  return (manifest.get('extra') or {}).get(
      coordinated.EXTRA_KEY) == record['id']


def coordination_handlers(shard: Shard) -> Dict[str, control_lib.Handler]:
  """The control methods of a shard of a sharded buffer (module docstring).

  Args:
    shard: the serving `ReplayServer`.

  Returns:
    `{'coordinated_save', 'coordinated_commit', 'coordinated_list',
    'coordinated_restore'}` handlers.
  """

  def save(request: Dict[str, Any]) -> Dict[str, Any]:
    coordinated_id = coordinated.check_id(request.get('id'))
    extra = dict(request.get('extra') or {})
    extra[coordinated.EXTRA_KEY] = coordinated_id
    path = shard.checkpoint(extra=extra,
                            reason=f'coordinated checkpoint {coordinated_id}')
    return {'path': path, 'counts': layout.read_manifest(path)['counts']}

  def commit(request: Dict[str, Any]) -> Dict[str, Any]:
    record = dict(request['record'], shard=int(request['shard']))
    return {'path': coordinated.write_record(shard.manager.checkpoint_dir,
                                             record)}

  def listing(request: Dict[str, Any]) -> Dict[str, List[Any]]:
    del request
    records = coordinated.read_records(shard.manager.checkpoint_dir)
    return {'records': records,
            'usable': [r['id'] for r in records if _still_here(r)]}

  def restore(request: Dict[str, Any]) -> Dict[str, Any]:
    coordinated_id = coordinated.check_id(request.get('id'))
    records = coordinated.read_records(shard.manager.checkpoint_dir)
    mine = [r for r in records if r['id'] == coordinated_id]
    if not mine:
      raise errors.CheckpointNotFoundError(
          f'this shard ({shard.manager.checkpoint_dir}) has no record of the '
          f'coordinated checkpoint {coordinated_id}; it has '
          f'{[r["id"] for r in records]}.')
    path = _own_entry(mine[0])['path']
    if not os.path.isdir(path):
      raise errors.CheckpointNotFoundError(
          f'the checkpoint {path} of coordinated checkpoint {coordinated_id} '
          'is no longer on this shard (pruned or deleted).')
    new = shard.reload(path, reason=f'coordinated checkpoint {coordinated_id}')
    return {'path': path, 'checkpoint': new}

  return {'coordinated_save': save, 'coordinated_commit': commit,
          'coordinated_list': listing, 'coordinated_restore': restore}
