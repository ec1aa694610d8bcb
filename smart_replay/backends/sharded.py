"""Client mode over a buffer sharded across several standalone servers.

Each shard is a `smart-replay-serve` of the same spec and tables, on its own
machine (or port). This backend connects to every shard (a `RemoteBackend`
each) and checks that they serve one config; the manager's observers write
to one shard, `writer_shard`, chosen from `RemoteBuffer.actor_id` (stable:
`actor_id % len(shards)`) or, without one, from the host name and process
id; `get_dataset` samples every shard as one big table would
(`sampling.batcher`). A checkpoint is one coordinated checkpoint of every
shard, and `load_replay_buffer` brings every shard back to one
(`coordinated`).
"""

import dataclasses
import os
import socket
import zlib
from typing import Any, Dict, List, Optional

from absl import logging

from smart_replay import errors
from smart_replay.backends import base
from smart_replay.backends import instances as instances_lib
from smart_replay.backends import coordinated_checkpoints
from smart_replay.backends import remote
from smart_replay.config import mixable
from smart_replay.config import options
from smart_replay.config import record
from smart_replay.control import credentials as credentials_lib


# Seconds between two checks of every shard (at most).
SHARD_CHECK_INTERVAL_S = 0.5


def writer_shard(actor_id: Optional[int], num_shards: int) -> int:
  """The shard a client's observers write to.

  Args:
    actor_id: the client's stable id, or None.
    num_shards: shards of the buffer.

  Returns:
    `actor_id % num_shards`; without an id, a shard chosen from the host
    name and process id (stable for the process only).
  """
  if actor_id is None:
    actor_id = zlib.crc32(f'{socket.gethostname()}:{os.getpid()}'.encode())
  return actor_id % num_shards


class ShardedBackend(base.Backend):
  """Clients of every shard of a sharded buffer.

  Args:
    data_spec: the local spec of one step.
    shape: what the client asks for (None fields: the shards').
    location: the shards' addresses and this client's `actor_id`.
    timeouts: `connect_timeout_s` and `checkpoint_timeout_s` are used.
  """
  resends = True  # Its observers send again what a restart of their shard lost.

  def __init__(self, data_spec: Any, *, shape: options.BufferShape,
               location: options.RemoteBuffer, timeouts: options.Timeouts):
    self.addresses = location.addresses
    # Every shard is called with the same credentials, resolved once.
    self.credentials = credentials_lib.ClientCredentials.resolve(
        **location.control_files)
    self._shards = [remote.RemoteBackend(
        data_spec, shape=shape, location=dataclasses.replace(
            location, server_address=address, actor_id=None),
        timeouts=timeouts, credentials=self.credentials)
                    for address in self.addresses]
    self.writer_shard = writer_shard(location.actor_id, len(self.addresses))
    # Shards are checked often: a shard that stops answering must stop
    # getting a share of the learner's batches soon.
    self.watch_interval_s = min(location.restart_check_s,
                                SHARD_CHECK_INTERVAL_S)
    self._instances = instances_lib.Instances(self.addresses,
                                              [None] * len(self.addresses))
    self.where = f'the {len(self.addresses)} shards {list(self.addresses)}'
    self.UNSUPPORTED = {method: why for method, why in
                        self._shards[0].UNSUPPORTED.items()
                        if method != 'load_replay_buffer'}
    self.config = None

  @property
  def checkpoint_dir(self) -> Optional[str]:
    """The writer shard's buffer directory, on its machine, once connected
    (every shard has its own)."""
    return self._shards[self.writer_shard].checkpoint_dir

  @property
  def keep_checkpoints(self) -> Optional[int]:
    """The writer shard's `keep_checkpoints`, once connected."""
    return self._shards[self.writer_shard].keep_checkpoints

  def connect(self) -> base.Started:
    """Connects to every shard and checks they serve one config.

    Returns:
      What was started: the writer shard's client, and every shard's.

    Raises:
      ServerUnavailableError: naming a shard that does not answer.
      ManifestMismatchError: if a shard's config differs from the local
        spec or from the other shards'.
    """
    started = []
    try:
      for shard in self._shards:
        started.append(shard.connect())
      self._check_same_config(started)
    except BaseException:
      self.stop()
      raise
    self.config = started[0].config
    self._instances = instances_lib.Instances(
        self.addresses, [shard.served_instance for shard in self._shards])
    logging.info('Connected to a buffer sharded over %s; this client writes '
                 'to shard %d (%s).', list(self.addresses), self.writer_shard,
                 self.addresses[self.writer_shard])
    mine = started[self.writer_shard]
    return base.Started(mine.client, mine.config, mine.server,
                        shards=tuple(s.client for s in started))

  def _check_same_config(self, started: List[base.Started]) -> None:
    """Every shard serves shard 0's spec, lengths, layout and tables (their
    sizes may differ), and each table can be drawn from across shards."""
    first = started[0].config
    for index, other in enumerate(started[1:], start=1):
      diffs = [d for d in record.diff_config(
          first.to_manifest(), other.config.to_manifest())
               if d[0] not in ('capacity',) and 'max_size' not in d[0]]
      if diffs:
        raise errors.ManifestMismatchError(
            f'shard {index} ({self.addresses[index]}) serves another buffer '
            f'than shard 0 ({self.addresses[0]}):\n'
            + record.format_differences(diffs, 'shard 0', f'shard {index}'),
            diffs)
    for name in first.table_names:
      mixable.check_drawable(first.table(name), 'the sharded table')

  def existing_checkpoints(self) -> List[str]:
    """Every shard's `ckpt-N` folders, as '<shard address> <path>'."""
    return [f'{address} {path}'
            for address, shard in zip(self.addresses, self._shards)
            for path in shard.existing_checkpoints()]

  def checkpoint(self, *, extra: Optional[Dict[str, Any]],
                 counts: Dict[str, Any],
                 starter: Optional[Dict[str, Any]] = None,
                 writer_marks: bool = False) -> str:
    """Writes one coordinated checkpoint of every shard
    (`coordinated_checkpoints.save`; the manager flushed its observers).

    Args:
      extra: user metadata, kept with every shard's checkpoint.
      counts: unused: the servers count what they save.
      starter: unused: the servers' checkpoints record no starter.
      writer_marks: unused: the servers decide.

    Returns:
      'coordinated <id>', then '<shard address> <checkpoint folder>' of
      every shard, one per line.

    Raises:
      CheckpointWriteError: if a shard did not save or record its part
        (names it); the coordinated checkpoint is then ignored by restores.
    """
    del counts, starter, writer_marks  # The servers decide these.
    reserved = coordinated_checkpoints.EXTRA_KEY
    if extra and reserved in extra:
      raise ValueError(f'extra may not hold the key {reserved!r} (the '
                       f'coordinated id goes there), got {extra!r}.')
    record = coordinated_checkpoints.save(self._call, self.addresses,
                                          extra=extra)
    return '\n'.join([f'coordinated {record["id"]}'] + [
        f'{shard["address"]} {shard["path"]}' for shard in record['shards']])

  def load(self, source: Optional[str], *, overwrite: bool) -> base.Started:
    """Connects, then brings every shard back to one coordinated checkpoint
    (`coordinated_checkpoints.restore`); each shard restores in place, so
    connected writers see a restart and count what they lose.

    Args:
      source: a coordinated checkpoint id; None: the newest complete one.
      overwrite: must be False (the servers own their directories).

    Returns:
      What was started; `loaded` is `{'path': 'coordinated <id>',
      'manifest': the whole buffer's counts
      (`coordinated_checkpoints.as_manifest`)}`.

    Raises:
      ValueError: if `overwrite` is True.
      CheckpointNotFoundError: if no complete coordinated checkpoint (or not
        `source`) is on every shard; says what each holds.
      ServerUnavailableError, ManifestMismatchError: as `connect`.
    """
    if overwrite:
      raise ValueError('overwrite=True cannot apply to a sharded buffer: each '
                       'server owns its directory. Restart the servers with '
                       "on_existing='overwrite' to empty them.")
    self.connect()
    try:
      record = coordinated_checkpoints.restore(self._call, self.addresses,
                                               source)
    finally:
      self.stop()
    # Each shard's Reverb server restarted in place: connect again, so that
    # nothing goes on over a connection to a server that is gone (its first
    # call would fail with 'GOAWAY' or 'Transport closed').
    started = self.connect()
    return dataclasses.replace(started, loaded={
        'path': f'coordinated {record["id"]}',
        'manifest': coordinated_checkpoints.as_manifest(record)})

  def _call(self, shard: int, method: str, args: Dict[str, Any]) -> Any:
    """Calls a control method on shard `shard`."""
    return self._shards[shard].call(method, args)

  def snapshot(self) -> base.Snapshot:
    """Every shard's snapshot (each server pauses its own writers).

    Returns:
      A `base.CountsSnapshot` over every shard (keys are unique across
      shards).
    """
    merged = {}
    for shard in self._shards:
      with shard.snapshot() as taken:
        for table, per_item in taken.times_sampled().items():
          merged.setdefault(table, {}).update(per_item)
    return base.CountsSnapshot(merged)

  def restarted(self, *, patient: bool = True,
                answered: Optional[Dict[str, Any]] = None
                ) -> Optional[Dict[str, Any]]:
    """Whether the writer shard was restarted (the only one this client's
    observers can have lost items on); see `RemoteBackend.restarted`."""
    return self._shards[self.writer_shard].restarted(patient=patient,
                                                     answered=answered)

  @property
  def writer_server(self) -> int:
    """The shard the observers write to."""
    return self.writer_shard

  def writer_marks(self, writer_id: str, *, live: bool = False,
                   above: int = 0) -> Dict[str, Any]:
    """What the writer shard has of one writer's items (the only shard this
    client's observers write to); see `RemoteBackend.writer_marks`."""
    return self._shards[self.writer_shard].writer_marks(
        writer_id, live=live, above=above)

  def check_servers(self, timeout_s: float
                    ) -> List[instances_lib.Change]:
    """Asks every shard which instance serves, one after the other; see
    `Backend.check_servers`.

    Args:
      timeout_s: how long each shard may take to answer.

    Returns:
      What changed since the last check, shard by shard.
    """
    return self._instances.update(
        [shard.instance(timeout_s) for shard in self._shards])

  def server_states(self) -> List[Dict[str, Any]]:
    """Per shard: `{'address', 'up', 'down_events'}` as the last check saw
    them."""
    return self._instances.states()

  def stop(self) -> None:
    """Closes every shard's control channel; the servers keep running."""
    for shard in self._shards:
      shard.stop()
