"""Reverb servers of the benchmark, each in its own process.

A buffer in its own process has its memory measured alone, and its restore
timed from a cold start.
"""

import multiprocessing
import os
import time
from typing import Any, Optional

import reverb

from smart_replay.core import local_server as server_lib
from smart_replay.core import tables as tables_lib
from smart_replay_benchmarks import extras
from smart_replay_benchmarks import workload as workload_lib

_START_TIMEOUT_S = 300.0


def make_server(spec: Any, capacity: int, root: str,
                fallback: Optional[str] = None) -> reverb.Server:
  """A Reverb server, in this process, with one benchmark table.

  Args:
    spec: the step spec.
    capacity: the table's max_size.
    root: the checkpoint root (must not hold a checkpoint).
    fallback: a checkpoint folder to restore, or None.

  Returns:
    The started server (restored from `fallback` if given).
  """
  return reverb.Server(
      [tables_lib.make_table(workload_lib.table_config(capacity), spec)],
      checkpointer=reverb.checkpointers.DefaultCheckpointer(
          root, fallback_checkpoint_path=fallback))


def _serve(connection, spec, capacity, root, fallback) -> None:
  """Runs one Reverb server (in a spawned process) until told to stop."""
  os.environ['TZ'] = 'UTC'  # Checkpoint folder names sort by time.
  time.tzset()
  start = time.perf_counter()
  server = make_server(spec, capacity, root, fallback)
  connection.send((server.port, time.perf_counter() - start))
  connection.recv()
  server.stop()


class ServerProcess:
  """A Reverb server with one benchmark table, in its own process.

  It is `make_server(spec, capacity, root, fallback)`, run in a spawned
  process until `close()`.

  Attributes:
    client: a `reverb.Client` of the server.
    load_seconds: how long the server took to start (to restore `fallback`).
  """

  def __init__(self, spec: Any, capacity: int, root: str,
               fallback: Optional[str] = None):
    context = multiprocessing.get_context('spawn')  # A forked client hangs.
    self._connection, child = context.Pipe()
    self._process = context.Process(
        target=_serve, args=(child, spec, capacity, root, fallback),
        daemon=True)
    self._process.start()
    child.close()  # A child that dies now closes the pipe: recv() fails.
    try:
      if not self._connection.poll(_START_TIMEOUT_S):
        raise TimeoutError(f'the benchmark server process (restoring '
                           f'{fallback!r}) did not start within '
                           f'{_START_TIMEOUT_S:g} s.')
      try:
        port, self.load_seconds = self._connection.recv()
      except EOFError:
        raise RuntimeError(
            f'the benchmark server process (restoring {fallback!r}) exited '
            f'with code {self._process.exitcode} before serving; see its '
            'log above.') from None
      self.client = reverb.Client(f'localhost:{port}')
      server_lib.server_info(self.client, 30.0)
    except BaseException:
      self._process.kill()
      self._process.join(10)
      raise

  def rss(self) -> int:
    """The server process's resident memory in bytes.

    Raises:
      ImportError: if psutil (the `bench` extra) is not installed.
    """
    psutil = extras.require('psutil')
    return psutil.Process(self._process.pid).memory_info().rss

  def items(self) -> int:
    """Items in the table."""
    info = server_lib.server_info(self.client, 30.0)
    return info[workload_lib.TABLE].current_size

  def close(self) -> None:
    """Stops the server; kills the process if it does not stop in 60 s."""
    if self._process.is_alive():
      try:
        self._connection.send('stop')
      except OSError:
        pass  # The pipe is gone; kill below.
      self._process.join(60)
      if self._process.is_alive():
        self._process.kill()
        self._process.join(10)

  def __enter__(self) -> 'ServerProcess':
    return self

  def __exit__(self, *unused) -> None:
    self.close()
