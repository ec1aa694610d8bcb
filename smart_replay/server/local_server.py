"""Starting a local Reverb server and talking to it with timeouts."""

import concurrent.futures
import math
import time
from typing import Callable, Dict, Optional, Sequence

from absl import logging
import portpicker
import reverb

from smart_replay import errors
from smart_replay.server import restore_progress
from smart_replay.utils import ports

# Tries at starting a server on a port picked here before giving up.
START_ATTEMPTS = 3


def _free_port() -> int:
  """A free port outside the ephemeral range, with its neighbour free.

  Not `bind(0)`'s choice: that comes from the ephemeral range, where a
  client connection of any process may take it again (and Reverb's own
  choice, `portpicker`, reuses ports of servers stopped moments ago, whose
  gRPC listener may still be shutting down: a new server there can start but
  never answer). P + 1 is free too, for a control service beside the server
  (`ports.free_port_pair`).
  """
  return ports.free_port_pair()


def server_info(client: reverb.Client, timeout_s: float
                ) -> Dict[str, reverb.reverb_types.TableInfo]:
  """Returns `client.server_info()`, failing after `timeout_s` seconds.

  Args:
    client: a Reverb client.
    timeout_s: seconds to wait for the answer (> 0).

  Returns:
    `{table_name: TableInfo}`.

  Raises:
    ServerUnavailableError: (a `WaitTimeoutError`) if the server did not
      answer in time; the message names the address and the timeout.
  """
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      return client.server_info(timeout=max(1, math.ceil(timeout_s)))
    except (reverb.errors.DeadlineExceededError, RuntimeError) as e:
      # 'Socket closed' is the first call on a channel whose server
      # restarted: the next call reconnects.
      if isinstance(e, RuntimeError) and time.monotonic() + 0.1 < deadline:
        time.sleep(0.1)
        continue
      raise errors.ServerUnavailableError(
          f'Reverb server at {client.server_address} did not answer '
          f'server_info within {timeout_s} s ({e}). Is the server running '
          'and reachable?') from e


def wait_for_checkpoint(save: concurrent.futures.Future, *, timeout_s: float,
                        where: str) -> str:
  """Waits for a `client.checkpoint()` running in `save`, up to `timeout_s`.

  `Client.checkpoint()` itself has no timeout, so callers run it in a thread
  pool and wait here; on a timeout the save goes on in its thread (keep
  `save` to wait for it later, and never join the pool unbounded).

  Args:
    save: the future of `client.checkpoint()`.
    timeout_s: seconds to wait.
    where: the checkpoint root, for messages.

  Returns:
    The folder Reverb wrote.

  Raises:
    WaitTimeoutError: if Reverb takes longer than `timeout_s`.
    CheckpointWriteError: if Reverb failed to write, whatever it raised
      (Reverb 0.14 reports a full disk as an `IndexError`, other failures as
      `RuntimeError` or `OSError`); names `where` and the cause.
  """
  try:
    return save.result(timeout=timeout_s)
  except concurrent.futures.TimeoutError as e:
    raise errors.WaitTimeoutError(
        f'Reverb did not finish writing a checkpoint to {where} within '
        f'{timeout_s:g} s (it may still be writing; raise the checkpoint '
        'timeout for large buffers).') from e
  except Exception as e:  # pylint: disable=broad-except
    raise errors.CheckpointWriteError(
        f'Reverb failed to write a checkpoint to {where}: '
        f'{type(e).__name__}: {e}') from e


def start_local_server(make_tables: Callable[[], Sequence[reverb.Table]], *,
                       checkpoint_root: str,
                       fallback_checkpoint: Optional[str] = None,
                       port: Optional[int] = None,
                       connect_timeout_s: float = 10.0):
  """Starts an in-process Reverb server with a checkpointer and waits for it.

  Reverb loads `checkpoint_root`'s newest checkpoint if there is one, else
  `fallback_checkpoint`; callers make sure the root is empty (see
  `CheckpointStore.prepare_reverb_root`) so that only the fallback can load.

  Args:
    make_tables: returns new `reverb.Table`s to serve (called once per
      attempt: a table belongs to the server it was started with).
    checkpoint_root: Reverb's checkpoint root.
    fallback_checkpoint: one specific checkpoint folder to restore, or None.
    port: TCP port; None picks a free one (and, if the new server does not
      answer or the port is taken meanwhile, starts it again on another port,
      up to `START_ATTEMPTS` times). An explicit port must be free (Reverb
      would otherwise start silently on a port already in use).
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
  if port is not None:
    return _start_once(make_tables, port, checkpoint_root, fallback_checkpoint,
                       connect_timeout_s)
  for attempt in range(1, START_ATTEMPTS):
    chosen = _free_port()
    try:
      return _start_once(make_tables, chosen, checkpoint_root,
                         fallback_checkpoint, connect_timeout_s)
    except (ValueError, errors.WaitTimeoutError) as e:
      if isinstance(e, ValueError) and 'BuildAndStart' not in str(e):
        raise  # Not a port taken meanwhile.
      logging.warning('The Reverb server on port %d did not start or answer '
                      '(%s); starting it on another port (attempt %d of %d).',
                      chosen, e, attempt + 1, START_ATTEMPTS)
  return _start_once(make_tables, _free_port(), checkpoint_root,
                     fallback_checkpoint, connect_timeout_s)


def _start_once(make_tables, port: int, checkpoint_root: str,
                fallback_checkpoint: Optional[str], connect_timeout_s: float):
  """Starts one server on `port` and waits for it to answer.

  Raises:
    ValueError: if gRPC cannot bind the port ('Failed to BuildAndStart').
    WaitTimeoutError: if the server does not answer (it is stopped).
  """
  with restore_progress.restoring(fallback_checkpoint):
    server = reverb.Server(
        list(make_tables()), port=port,
        checkpointer=reverb.checkpointers.DefaultCheckpointer(
            checkpoint_root, fallback_checkpoint_path=fallback_checkpoint))
  client = reverb.Client(f'localhost:{server.port}')
  try:
    server_info(client, connect_timeout_s)
  except errors.WaitTimeoutError:
    server.stop()
    raise
  # Once per process: every buffer's Reverb server is reachable so.
  logging.log_first_n(
      logging.INFO, 'Reverb serves this buffer on port %d of ALL network '
      'interfaces, without authentication (Reverb 0.14 cannot bind one '
      'address): anyone who reaches the port can read, write and reset it. '
      'On a shared or exposed machine, close it with a firewall rule or a '
      'network namespace (docs/remote.md: "Security").', 1, server.port)
  return server, client
