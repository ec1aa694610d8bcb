"""Starting a local Reverb server and talking to it with timeouts."""

import math
from typing import Dict, Optional, Sequence

import portpicker
import reverb

from smart_replay import errors


def server_info(client: reverb.Client, timeout_s: float
                ) -> Dict[str, reverb.reverb_types.TableInfo]:
  """Returns `client.server_info()`, failing after `timeout_s` seconds.

  Args:
    client: a Reverb client.
    timeout_s: seconds to wait for the answer (> 0).

  Returns:
    `{table_name: TableInfo}`.

  Raises:
    WaitTimeoutError: if the server did not answer in time; the message names
      the address and the timeout.
  """
  try:
    return client.server_info(timeout=max(1, math.ceil(timeout_s)))
  except (reverb.errors.DeadlineExceededError, RuntimeError) as e:
    raise errors.WaitTimeoutError(
        f'Reverb server at {client.server_address} did not answer server_info '
        f'within {timeout_s} s ({e}). Is the server running and reachable?'
    ) from e


def start_local_server(tables: Sequence[reverb.Table], *, checkpoint_root: str,
                       fallback_checkpoint: Optional[str] = None,
                       port: Optional[int] = None,
                       connect_timeout_s: float = 10.0):
  """Starts an in-process Reverb server with a checkpointer and waits for it.

  Reverb loads `checkpoint_root`'s newest checkpoint if there is one, else
  `fallback_checkpoint`; callers make sure the root is empty (see
  `CheckpointStore.prepare_reverb_root`) so that only the fallback can load.

  Args:
    tables: the tables to serve.
    checkpoint_root: Reverb's checkpoint root.
    fallback_checkpoint: one specific checkpoint folder to restore, or None.
    port: TCP port; None picks a free one. An explicit port must be free
      (Reverb would otherwise start silently on a port already in use).
    connect_timeout_s: how long to wait for the new server to answer.

  Returns:
    `(server, client)`.

  Raises:
    ValueError: if `port` is already in use.
    WaitTimeoutError: if the server does not answer within the timeout.
  """
  if port is not None and not portpicker.is_port_free(port):
    raise ValueError(f'port {port} is already in use; pass another port or '
                     'port=None to pick a free one.')
  checkpointer = reverb.checkpointers.DefaultCheckpointer(
      checkpoint_root, fallback_checkpoint_path=fallback_checkpoint)
  server = reverb.Server(list(tables), port=port, checkpointer=checkpointer)
  client = reverb.Client(f'localhost:{server.port}')
  try:
    server_info(client, connect_timeout_s)
  except errors.WaitTimeoutError:
    server.stop()
    raise
  return server, client
