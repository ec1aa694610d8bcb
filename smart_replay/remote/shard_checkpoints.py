"""A shard's part in coordinated checkpoints of a sharded buffer.

The control methods a `ReplayServer` adds for `backends.sharded` (the
protocol is in `storage.coordinated`):

* 'coordinated_save' `{id, extra}`: phase 1, writes a checkpoint tagged
  with the coordinated id; answers its path and counts;
* 'coordinated_commit' `{record, shard}`: phase 2, writes the record, once
  it fits the schema and names the checkpoint this shard tagged with its id;
* 'coordinated_list': this shard's records, and the ids whose checkpoint is
  still here;
* 'coordinated_restore' `{id}`: restores this shard's own checkpoint tagged
  with that id in place (`ReplayServer.reload`): same ports, a new server
  instance, so connected writers count what they lose.

No path is taken from the network: a restore names an id only, and the
shard finds its checkpoint inside its own `checkpoints/` folder.
"""

import os
from typing import Any, Dict, List, Protocol

from smart_replay import errors
from smart_replay.manager import facade as manager_lib
from smart_replay.remote import handlers
from smart_replay.remote import requests
from smart_replay.control import server as control_server
from smart_replay.control import protocol
from smart_replay.server import checkpointer
from smart_replay.storage import coordinated_records
from smart_replay.storage import checkpoint_folders


class Shard(Protocol):
  """What the handlers need of a `ReplayServer`."""

  @property
  def manager(self) -> manager_lib.ReplayBufferManager:
    """The served buffer's manager (it changes at a reload)."""

  @property
  def spacing(self) -> requests.Spacing:
    """Spaces the saves clients ask for."""

  def checkpoint(self, *, extra: Any = None, reason: str = '') -> str:
    """Writes a checkpoint now; returns its folder."""

  def reload(self, path: str, *, reason: str) -> str:
    """Restores checkpoint `path` in place; returns the new checkpoint."""


def _names_own(named: str, mine: str, buffer_dir: str) -> bool:
  """Whether a record's path is this shard's checkpoint `mine`, as phase 1
  answered it (a service without a token shows it as '<buffer>/...')."""
  answered = os.path.join(buffer_dir, checkpoint_folders.CHECKPOINTS_DIR,
                          os.path.basename(mine))
  return (os.path.realpath(named) == mine or
          named == handlers.redact(answered, root=buffer_dir))


def coordination_handlers(shard: Shard) -> Dict[str, control_server.Handler]:
  """The control methods of a shard of a sharded buffer (module docstring).

  Args:
    shard: the serving `ReplayServer`.

  Returns:
    `{'coordinated_save', 'coordinated_commit', 'coordinated_list',
    'coordinated_restore'}` handlers.
  """

  def buffer_dir() -> str:
    return shard.manager.checkpoint_dir

  def save(request: Dict[str, Any]) -> Dict[str, Any]:
    coordinated_id = coordinated_records.check_current_id(request.get('id'))
    extra = handlers.client_extra(request)
    extra[coordinated_records.EXTRA_KEY] = coordinated_id
    with shard.spacing.spaced():
      path = shard.checkpoint(
          extra=extra, reason=f'coordinated checkpoint {coordinated_id}')
    counts = checkpoint_folders.read_manifest(path)['counts']
    counts.pop(checkpointer.WRITER_MARKS_KEY, None)  # Each shard keeps its own.
    return {'path': path, 'counts': counts}

  def commit(request: Dict[str, Any]) -> Dict[str, Any]:
    record = request.get('record')
    if not isinstance(record, dict):
      raise ValueError(f'record must be a JSON object, got '
                       f'{type(record).__name__}.')
    record = coordinated_records.check_record(dict(record, shard=request.get('shard')))
    mine = coordinated_records.tagged_checkpoint(buffer_dir(), record['id'])
    named = record['shards'][record['shard']]['path']
    if mine is None or not _names_own(named, mine, buffer_dir()):
      raise errors.CheckpointNotFoundError(
          f'coordinated checkpoint {record["id"]}: shard {record["shard"]} '
          f'holds no checkpoint tagged with it at {named!r:.200}; phase 1 '
          '(coordinated_save) must have written it here.')
    return {'path': coordinated_records.write_record(buffer_dir(), record)}

  def listing(request: Dict[str, Any]) -> Dict[str, List[Any]]:
    del request
    records = coordinated_records.read_records(buffer_dir())
    return {'records': records,
            'usable': [r['id'] for r in records
                       if coordinated_records.tagged_checkpoint(buffer_dir(), r['id'])]}

  def restore(request: Dict[str, Any]) -> Dict[str, Any]:
    coordinated_id = coordinated_records.check_id(request.get('id'))
    recorded = [r['id'] for r in coordinated_records.read_records(buffer_dir())]
    if coordinated_id not in recorded:
      raise errors.CheckpointNotFoundError(
          f'this shard has no record of the coordinated checkpoint '
          f'{coordinated_id}; it has {recorded}.')
    path = coordinated_records.tagged_checkpoint(buffer_dir(), coordinated_id)
    if path is None:
      raise errors.CheckpointNotFoundError(
          f'this shard no longer holds its checkpoint of coordinated '
          f'checkpoint {coordinated_id} (pruned or deleted).')
    new = shard.reload(path, reason=f'coordinated checkpoint {coordinated_id}')
    return {'path': path, 'checkpoint': new}

  return {protocol.COORDINATED_SAVE: save,
          protocol.COORDINATED_COMMIT: commit,
          protocol.COORDINATED_LIST: listing,
          protocol.COORDINATED_RESTORE: restore}
