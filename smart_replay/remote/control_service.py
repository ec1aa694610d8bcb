"""The control service of a served buffer: its methods, guarded and bounded.

`serve_control` puts the methods of `handlers` and `coordination` on the
control port (`server.control`), as `access` says (the address, the token,
TLS): calls that may take long are bounded (`protocol.SLOW_METHODS`), and
a service that serves without a token hides this machine's paths, process
ids and host name from its answers (`handlers.redact`). It logs once what each
of the server's ports allows.
"""

import functools
from typing import Any, Callable, ContextManager, Dict, Optional

from absl import logging

from smart_replay.remote import shard_checkpoints
from smart_replay.remote import handlers
from smart_replay.remote import status
from smart_replay.control import server as control_server
from smart_replay.control import access as control_access
from smart_replay.control import protocol


def serve_control(shard: shard_checkpoints.Shard, *, instance: Dict[str, Any],
                  checkpoint: Callable[..., str],
                  exclusive: Callable[[], ContextManager[Any]],
                  access: control_access.ControlAccess,
                  secrets: control_access.ServerSecrets,
                  port: Optional[int]
                  ) -> control_server.ControlServer:
  """Starts the control service of a `ReplayServer`.

  Args:
    shard: the serving `ReplayServer` (its manager changes at a reload).
    instance: `serving_record.describe_instance()` of the serving instance.
    checkpoint: writes a checkpoint a client asked for (`extra=`).
    exclusive: held while `times_sampled` reads its snapshot.
    access: where to listen and who may call.
    secrets: the tokens and TLS credentials (`access.secrets()`).
    port: the control port; None: the Reverb port + 1.

  Returns:
    The running service.

  Raises:
    ValueError: if the port cannot be bound.
  """
  manager = shard.manager
  reverb_port = int(manager.server_address.rpartition(':')[2])
  control = control_server.ControlServer(
      {**handlers.control_handlers(lambda: shard.manager, instance=instance,
                                   checkpoint=checkpoint,
                                   exclusive=exclusive),
       **shard_checkpoints.coordination_handlers(shard)},
      port=port or protocol.default_control_port(reverb_port),
      access=access, secrets=secrets,
      redact=None if secrets.operator_token else functools.partial(
          handlers.redact, root=manager.checkpoint_dir))
  logging.warning('%s', status.security_warning(
      port=reverb_port, control_host=access.host, control_port=control.port,
      access=access.describe(secrets.fingerprint)))
  return control
