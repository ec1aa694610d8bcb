"""Client mode: a buffer served by a standalone server (`smart-replay-serve`).

The server creates, restores and checkpoints the buffer; this backend reads
its configuration over the control channel, checks it against the local
spec and arguments, asks the server for checkpoints and snapshots, and
notices when a reconnect reached a restarted server.
"""

import dataclasses
import threading
import time
from typing import Any, Dict, List, Optional

from absl import logging
import reverb

from smart_replay import errors
from smart_replay.backends import base
from smart_replay.backends import instances as instances_lib
from smart_replay.config import buffer as config_lib
from smart_replay.config import options
from smart_replay.config import record
from smart_replay.config import reverb_tables
from smart_replay.control import client as control_client
from smart_replay.control import protocol
from smart_replay.control import credentials as credentials_lib
from smart_replay.server import local_server as server_lib


class RemoteBackend(base.Backend):
  """A client of the server at `server_address`.

  Args:
    data_spec: the local spec of one step.
    shape: what the client asks for; its fields that are not None must
      match the server's (the rest is taken from the server).
    location: the server's Reverb and control addresses, and the control
      credentials' files.
    timeouts: `connect_timeout_s` and `checkpoint_timeout_s` are used.
    credentials: the control credentials, already resolved (a sharded
      client's, once for every shard); None: from `location`.

  Raises:
    AuthenticationError: if a token file cannot be used (names it).
    ValueError: if a TLS file is missing or given without its pair.
  """
  resends = True  # Its observers send again what a restart lost.

  def __init__(self, data_spec: Any, *, shape: options.BufferShape,
               location: options.RemoteBuffer, timeouts: options.Timeouts,
               credentials: Optional[
                   credentials_lib.ClientCredentials] = None):
    server_address = location.addresses[0]
    self._data_spec = data_spec
    requested = {f.name: getattr(shape, f.name)
                 for f in dataclasses.fields(shape)}
    self._requested = {k: list(v) if k == 'table_configs' else v
                       for k, v in requested.items() if v is not None}
    self._address = server_address
    self._control_address = (location.control_address or
                             protocol.control_address_for(server_address))
    self.credentials = (credentials or credentials_lib.ClientCredentials
                        .resolve(**location.control_files))
    self._connect_timeout_s = timeouts.connect_timeout_s
    self._checkpoint_timeout_s = timeouts.checkpoint_timeout_s
    # Guards the instance seen last (observers reconnect from their threads).
    self._instance_lock = threading.Lock()
    self.watch_interval_s = location.restart_check_s
    self.where = f'the server at {server_address}'
    self.config = None
    self._control = self._probe = None
    self._reverb = reverb.Client(server_address)
    self._served = None  # The server's 'info' answer.
    self._instances = instances_lib.Instances([server_address], [None])
    local = ('{method}() starts a local server; this manager is a client of '
             f'{server_address} (the server creates, loads and checkpoints '
             'the buffer): call connect().')
    self.UNSUPPORTED = {
        'create_replay_buffer': local.format(method='create_replay_buffer'),
        'load_replay_buffer': local.format(method='load_replay_buffer'),
        'epoch': ('epoch() reads an exact snapshot of the tables on the '
                  "server's disk; run it where the buffer is served (or "
                  'export the buffer with smart_replay.tools.export and read '
                  'that).')}

  @property
  def checkpoint_dir(self) -> Optional[str]:
    """The server's buffer directory, on its machine, once connected."""
    return self._served['checkpoint_dir'] if self._control else None

  @property
  def served_instance(self) -> Optional[Dict[str, Any]]:
    """The instance that answered `connect()` (None before)."""
    return (self._served.get('instance') or {}) if self._served else None

  @property
  def keep_checkpoints(self) -> Optional[int]:
    """The server's `keep_checkpoints`, once connected."""
    return self._served['keep_checkpoints'] if self._control else None

  def connect(self) -> base.Started:
    """Connects and adopts the served config; see
    `ReplayBufferManager.connect`.

    Returns:
      What was started (the server's config).

    Raises:
      ServerUnavailableError: if the server does not answer in time.
      ManifestMismatchError: if the served config or tables differ from the
        local ones.
    """
    client = self._reverb = reverb.Client(self._address)
    try:
      info = server_lib.server_info(client, self._connect_timeout_s)
    except errors.WaitTimeoutError as e:
      raise errors.ServerUnavailableError(
          f'no Reverb server answered at {self._address} within '
          f'{self._connect_timeout_s:g} s (connect_timeout_s). Is '
          'smart-replay-serve running there, and is the port reachable from '
          'this machine (firewall, tunnel)?') from e
    control = control_client.ControlClient(self._control_address,
                                        credentials=self.credentials)
    try:
      served = control.call(protocol.INFO, timeout_s=self._connect_timeout_s)
      self.config = self._adopt(served['config'])
      diffs = reverb_tables.server_differences(
          self.config.tables, self.config.step_layout.step_spec, info,
          self.config.step_layout.lookback)
      if diffs:
        raise errors.ManifestMismatchError(
            f'the Reverb tables at {self._address} differ from the '
            f'local spec ({len(diffs)} difference(s)):\n'
            + record.format_differences(diffs, 'server', 'local'), diffs)
      self._control, self._served = control, served
      self._instances = instances_lib.Instances(
          [self._address], [served.get('instance') or {}])
    except BaseException:
      control.close()
      self._control = self._served = self.config = None
      raise
    logging.info('Connected to the replay buffer served at %s (tables %s, '
                 'checkpoints in %s on the server).', self._address,
                 self.config.table_names, served['checkpoint_dir'])
    return base.Started(client, self.config,
                        {'server_address': self._address})

  def _adopt(self, stored: Dict[str, Any]) -> config_lib.BufferConfig:
    """The server's buffer config; raises if the local arguments differ."""
    served = config_lib.BufferConfig.from_manifest(
        stored, data_spec=self._data_spec).constructor_kwargs()
    config = config_lib.BufferConfig.resolve(
        data_spec=self._data_spec, **{**served, **self._requested}
    ).with_writer_ids_of(stored)
    diffs = config.diff(stored)
    if diffs:
      raise errors.ManifestMismatchError(
          f'the buffer served at {self._address} has another '
          f'configuration than this client ({len(diffs)} difference(s)):\n'
          + record.format_differences(diffs, 'server', 'local')
          + '\nBuild the client from the same collect_data_spec as the '
          'server, and pass no capacity/sequence_length/stride_length/'
          'table_configs/layout (they are read from the server) or the same '
          'ones.',
          diffs)
    return config

  def call(self, method: str, args: Optional[Dict[str, Any]] = None, *,
           timeout_s: Optional[float] = None) -> Any:
    """Calls a control method of the server (see `remote.handlers`).

    Args:
      method: the method's name.
      args: its JSON arguments.
      timeout_s: how long to wait; None: 3 x `checkpoint_timeout_s` (the
        server may first finish a save in progress).

    Returns:
      The server's answer.

    Raises:
      ManagerStateError: if not connected.
      ServerUnavailableError: if the server does not answer in time.
      SmartReplayError: the error the server raised, with its message.
    """
    if self._control is None:
      raise errors.ManagerStateError(
          f'not connected to {self._address}; call connect() first.')
    if timeout_s is None:
      timeout_s = 3 * self._checkpoint_timeout_s
    return self._control.call(method, args, timeout_s=timeout_s)

  def existing_checkpoints(self) -> List[str]:
    """The server's `ckpt-N` folders (paths on its machine), oldest first.

    Raises:
      ManagerStateError: if not connected.
      ServerUnavailableError: if the server does not answer in time.
    """
    if self._control is None:
      raise errors.ManagerStateError(
          'the buffer is not started; call create_replay_buffer() or '
          'load_replay_buffer() first (connect() in client mode).')
    return self.call(protocol.INFO, timeout_s=self._connect_timeout_s)['checkpoints']

  def checkpoint(self, *, extra: Optional[Dict[str, Any]],
                 counts: Dict[str, Any],
                 starter: Optional[Dict[str, Any]] = None,
                 writer_marks: bool = False) -> str:
    """Has the server checkpoint (the manager flushed its observers).

    Args:
      extra: user metadata for the manifest.
      counts: unused: the server counts what it saves.
      starter: unused: the server's checkpoints record no starter (a
        client's starter is its own, for its datasets).
      writer_marks: unused: the server records them.

    Returns:
      The checkpoint folder on the server's machine.

    Raises:
      ServerUnavailableError: if the server does not answer within
        3 x `checkpoint_timeout_s`.
    """
    del counts, starter, writer_marks  # The server decides these.
    # The server may first wait for its own save in progress.
    path = self.call(protocol.CHECKPOINT, {'extra': extra},
                      timeout_s=3 * self._checkpoint_timeout_s)
    logging.info('The server at %s checkpointed to %s', self._address, path)
    return path

  def writer_marks(self, writer_id: str, *, live: bool = False,
                   above: int = 0) -> Dict[str, Any]:
    """What the server has of one writer's items (see
    `base.Backend.writer_marks`; with `live` the server takes an exact
    snapshot, one for every writer that asked before it began). Without
    `live`, marks of a server instance this client has not seen yet are
    None (a restart not handled yet).

    Raises:
      ServerUnavailableError: if the server does not answer within
        3 x `checkpoint_timeout_s`.
      SmartReplayError: the error the server raised (e.g. its layout stores
        no writer ids).
    """
    request = {'writer_id': writer_id}
    if live:
      request.update(live=True, above=above)
    answer = self.call(protocol.WRITER_MARKS, request,
                       timeout_s=3 * self._checkpoint_timeout_s)
    with self._instance_lock:
      known = ((self._served or {}).get('instance') or {}).get('id')
    if not live and answer.get('instance') != known:
      # A restart this client has not handled yet: its marks may be above
      # what the restart lost.
      answer = {**answer, 'marks': None}
    return answer

  def snapshot(self) -> base.Snapshot:
    """The server's snapshot of its tables (it pauses its own writers).

    Returns:
      A `base.CountsSnapshot` of `{table: {item key: times sampled}}`.
    """
    served = self.call(protocol.TIMES_SAMPLED, timeout_s=self._checkpoint_timeout_s)
    return base.CountsSnapshot({
        name: {int(key): n for key, n in per_item.items()}
        for name, per_item in served.items()})

  def restarted(self, *, patient: bool = True,
                answered: Optional[Dict[str, Any]] = None
                ) -> Optional[Dict[str, Any]]:
    """Asks the server whether it is a new instance (it was restarted) since
    the last answer: at the manager's flushes and checkpoints, and from its
    watcher (every `restart_check_s`, and at once after a write waited for
    the server).

    Args:
      patient: retry for up to 3 x `connect_timeout_s` while the server does
        not answer (and warn if it never does); False: ask once and say
        nothing if it does not answer (the next check asks again).
      answered: the instance the server just answered with
        (`check_servers`); None asks it.

    Returns:
      The new instance (`restored_save_started` says which items the restart
      lost), or None if it is the same server or could not be asked.
    """
    instance = answered
    if instance is None:
      try:
        instance = self._ask_instance(patient=patient)
      except errors.SmartReplayError as e:
        if patient:
          logging.warning('Could not ask the server at %s whether it '
                          'restarted (%s); items a restart lost are not '
                          'counted.', self._address, e)
        return None
    with self._instance_lock:
      if self._served is None:
        return None  # Disconnected meanwhile.
      if instance.get('id') == self._served.get('instance', {}).get('id'):
        return None  # The same server: the connection was interrupted only.
      self._served['instance'] = instance
      return instance

  def _ask_instance(self, *, patient: bool) -> Dict[str, Any]:
    """The server's instance (see `ReplayServer`), on a new control channel:
    the old one may still be backing off from the server that died.

    Args:
      patient: retry for up to 3 x `connect_timeout_s`; False: ask once.

    Raises:
      ServerUnavailableError: if no answer came in time.
    """
    deadline = time.monotonic() + 3 * self._connect_timeout_s
    while True:
      control = control_client.ControlClient(self._control_address,
                                        credentials=self.credentials)
      try:
        return control.call(protocol.INFO, timeout_s=self._connect_timeout_s).get(
            'instance') or {}
      except errors.ServerUnavailableError:
        if not patient or time.monotonic() > deadline:
          raise
      finally:
        control.close()
      time.sleep(0.5)

  def instance(self, timeout_s: float) -> Optional[Dict[str, Any]]:
    """Which instance of the server answers now, asked once; its Reverb
    port must answer too.

    The control channel is kept between calls and made anew after a failure
    (gRPC would back off on the old one). Asking Reverb's port reconnects
    this process's connection to it after a restart (the first call on the
    old one fails with 'Socket closed'), before any dataset needs it.

    Args:
      timeout_s: how long each service may take to answer.

    Returns:
      The instance (`{'id', ...}`), or None if either service did not
      answer.
    """
    if self._probe is None:
      self._probe = control_client.ControlClient(self._control_address,
                                              credentials=self.credentials)
    try:
      instance = self._probe.call(protocol.INFO, timeout_s=timeout_s).get(
          'instance') or {}
      server_lib.server_info(self._reverb, timeout_s)
    except errors.SmartReplayError:
      self._probe.close()
      self._probe = None
      return None
    return instance

  def check_servers(self, timeout_s: float
                    ) -> List[instances_lib.Change]:
    """Asks the server which instance serves; see `Backend.check_servers`.

    Args:
      timeout_s: how long it may take to answer.

    Returns:
      What changed since the last check.
    """
    return self._instances.update([self.instance(timeout_s)])

  def stop(self) -> None:
    """Closes the control channels; the server keeps running."""
    for control in (self._control, self._probe):
      if control is not None:
        control.close()
    self._control = self._probe = None
