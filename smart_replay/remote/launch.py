"""What the `smart-replay-serve` binary runs: load a spec, serve its buffer.

`serve()` builds a `ReplayBufferManager` from a saved `collect_data_spec` and
gin bindings, wraps it in a `ReplayServer` and serves until asked to stop,
ending with a final checkpoint. Reverb's port listens on `reverb_host` only
(127.0.0.1 by default), which needs the process started with the
bind-address library (`smart_replay.ops.bind_address`; the binary restarts
itself with it), unless it is every interface ('0.0.0.0' or '::'); the
kernel's listening sockets are checked once serving.
"""

import ipaddress
from typing import Callable, Optional

import gin

from smart_replay.manager import facade as manager_lib
from smart_replay.ops import bind_address
from smart_replay.remote import metrics
from smart_replay.remote import replay_server
from smart_replay.control import access as control_access
from smart_replay.spec import specs


@gin.configurable(denylist=['stop_requested', 'ready'])
def serve(*, spec_file: str, checkpoint_dir: str, port: int = 8000,
          reverb_host: str = bind_address.LOOPBACK,
          control_port: Optional[int] = None,
          metrics_port: Optional[int] = None,
          metrics_host: str = '127.0.0.1',
          capacity: Optional[int] = None,
          sequence_length: Optional[int] = None,
          stride_length: Optional[int] = None,
          access: Optional[control_access.ControlAccess] = None,
          stop_requested: Callable[[], bool],
          ready: Callable[[str], None] = print) -> Optional[str]:
  """Loads a spec file and serves its buffer until asked to stop.

  The buffer's capacity and lengths come from the arguments when given, else
  (and its tables always) from gin bindings of `ReplayBufferManager` (e.g.
  configs/serve.gin); the schedule from those of `ReplayServer`.

  Args:
    spec_file: the `collect_data_spec`, saved with `specs.save_spec`.
    checkpoint_dir: the buffer directory (created or resumed).
    port: the Reverb port.
    reverb_host: the address Reverb's port listens on: '127.0.0.1' (this
      machine only), an address of one of its interfaces, or '0.0.0.0' /
      '::' (every interface: actors and learners on other machines). One
      address needs this process started with the bind-address library for
      `port` (`bind_address.ensure_in_force`, which `smart-replay-serve`
      runs first); Reverb has no authentication either way.
    control_port: the control service's port; None: `port + 1`, unless
      gin binds `ReplayServer.control_port`.
    metrics_port: serve Prometheus metrics at
      `http://<metrics_host>:<metrics_port>/metrics` (see `metrics`); 0
      picks a free port; None: no metrics endpoint.
    metrics_host: the address the metrics endpoint binds; it asks for the
      control token, and shares the control service's TLS files.
    capacity: the buffer's capacity in items; None: gin's.
    sequence_length: steps per item; None: gin's.
    stride_length: steps between item starts; None: gin's.
    access: where the control service listens and who may call it; None:
      `ControlAccess()` as gin binds it (loopback, a token).
    stop_requested: polled; once true, a final checkpoint is written.
    ready: called with one line giving the addresses once serving.

  Returns:
    The final checkpoint.

  Raises:
    ValueError: if the spec or config is invalid, a port is in use, or
      `reverb_host` is not an address of this machine (names it).
    BindAddressError: if `reverb_host` is one address and this process was
      not started to bind it, or Reverb's port listens elsewhere once
      started (the server is closed; says how to start one that binds it).
    SmartReplayError: if the buffer cannot be created or resumed.
  """
  reverb_host = bind_address.check_host(reverb_host)
  bind_address.require(port, reverb_host)  # Before the buffer opens.
  data_spec = specs.load_spec(spec_file)
  shape = {name: value for name, value in (
      ('capacity', capacity), ('sequence_length', sequence_length),
      ('stride_length', stride_length)) if value is not None}
  manager = manager_lib.ReplayBufferManager(
      data_spec=data_spec, checkpoint_dir=checkpoint_dir, port=port, **shape)
  access = access or control_access.ControlAccess()
  server = replay_server.ReplayServer(
      manager, access=access,
      **({'control_port': control_port} if control_port else {}))
  server.start()
  endpoint = None
  try:
    # What the kernel says, not what was asked: refuse to serve elsewhere.
    bind_address.check_listening(server.port, reverb_host)
    if metrics_port is not None:
      endpoint = metrics.MetricsEndpoint(
          server, port=metrics_port, host=metrics_host,
          token=server.secrets.reader_token,
          tls_cert_file=access.tls_cert_file,
          tls_key_file=access.tls_key_file,
          tls_client_ca_file=access.tls_client_ca_file,
          allow_unauthenticated_remote=not access.protected_mode)
    token = (f' Control token: {server.token_file}.' if server.token_file
             else ' The control service asks for NO token.')
    ready(f'Serving {[c.name for c in manager.table_configs]} at '
          f'{_reverb_address(server, reverb_host)}; control at {access.host}:'
          f'{server.control_port}){_on_this_machine(server, reverb_host)}.'
          f' Checkpoints in {manager.checkpoint_dir}.{token}' +
          (f' Metrics at {endpoint.url}.' if endpoint else ''))
  except BaseException:
    if endpoint is not None:
      endpoint.close()
    server.close(final_checkpoint=False)
    raise
  try:
    return server.serve_until(stop_requested)
  finally:
    if endpoint is not None:
      endpoint.close()


def _reverb_address(server: replay_server.ReplayServer, host: str) -> str:
  """Where clients reach Reverb, and from where, for the ready line."""
  if bind_address.everywhere(host):
    return f'{server.address} (Reverb, every interface'
  where = ('this machine only' if ipaddress.ip_address(host).is_loopback
           else 'this address only')
  address = bind_address.address_for_clients(host, server.port)
  return f'{address} (Reverb, {where}'


def _on_this_machine(server: replay_server.ReplayServer, host: str) -> str:
  """The loopback address of a server on every interface ('' otherwise:
  the address given is the one to use, on this machine too)."""
  if not bind_address.everywhere(host):
    return ''
  return ('; on this machine: ' + bind_address.address_for_clients(
      bind_address.LOOPBACK, server.port))
