"""What the `smart-replay-serve` binary runs: load a spec, serve its buffer.

`serve()` builds a `ReplayBufferManager` from a saved `collect_data_spec` and
gin bindings, wraps it in a `ReplayServer` and serves until asked to stop,
ending with a final checkpoint.
"""

from typing import Callable, Optional

import gin

from smart_replay.manager import facade as manager_lib
from smart_replay.remote import metrics
from smart_replay.remote import replay_server
from smart_replay.control import access as control_access
from smart_replay.spec import specs


@gin.configurable(denylist=['stop_requested', 'ready'])
def serve(*, spec_file: str, checkpoint_dir: str, port: int = 8000,
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
    ValueError: if the spec or config is invalid or a port is in use.
    SmartReplayError: if the buffer cannot be created or resumed.
  """
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
          f'{server.address} (Reverb; control at {access.host}:'
          f'{server.control_port}); on this machine: 127.0.0.1:{server.port}.'
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
