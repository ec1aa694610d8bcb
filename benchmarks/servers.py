"""Reverb servers of the benchmark, each in its own process.

A buffer in its own process has its memory measured alone, and its restore
timed from a cold start. The process also samples itself on request
(`ServerProcess.sample`), so a learner-like, in-process sampling rate can be
measured at any size of the buffer.
"""

import os
import time
from typing import Any, Optional

import reverb

from smart_replay.server import local_server as server_lib
from smart_replay_benchmarks import extras
from smart_replay_benchmarks import side_processes
from smart_replay_benchmarks import workload as workload_lib

_START_TIMEOUT_S = 300.0
_SAMPLE_TIMEOUT_S = 1800.0


def _serve(connection, spec, capacity, root, fallback, buffer) -> None:
  """Runs one Reverb server (in a side process) until told to stop;
  answers ('sample', pipeline, batch_size, batches) requests meanwhile."""
  os.environ['TZ'] = 'UTC'  # Checkpoint folder names sort by time.
  time.tzset()
  start = time.perf_counter()
  server = workload_lib.make_server(spec, capacity, root, fallback, buffer)
  connection.send((server.port, time.perf_counter() - start))
  while True:
    request = connection.recv()
    if request == 'stop':
      break
    # Imported here: the parent needs no TensorFlow datasets for this.
    from smart_replay_benchmarks import sampling  # pylint: disable=g-import-not-at-top
    _, pipeline, batch_size, batches = request
    client = reverb.Client(f'localhost:{server.port}')
    connection.send(sampling.rate(sampling.make_pipeline(
        pipeline, client, spec, batch_size), batches, batch_size))
  server.stop()


class ServerProcess:
  """A Reverb server with one benchmark table, in its own process.

  It is `workload.make_server(spec, capacity, root, fallback, buffer)`, run
  in its own process (`side_processes`) until `close()`.

  Attributes:
    client: a `reverb.Client` of the server.
    load_seconds: how long the server took to start (to restore `fallback`).
    buffer: how the buffer stores the stream.
  """

  def __init__(self, spec: Any, capacity: int, root: str,
               fallback: Optional[str] = None,
               buffer: workload_lib.Buffer = workload_lib.Buffer()):
    self.buffer = buffer
    context = side_processes.context()
    self._connection, child = context.Pipe()
    self._process = context.Process(
        target=_serve, args=(child, spec, capacity, root, fallback, buffer),
        daemon=True)
    self._process.start()
    child.close()  # A child that dies now closes the pipe: recv() fails.
    try:
      port, self.load_seconds = self._receive(
          _START_TIMEOUT_S, f'start (restoring {fallback!r})')
      self.client = reverb.Client(f'localhost:{port}')
      server_lib.server_info(self.client, 30.0)
    except BaseException:
      self._process.kill()
      self._process.join(10)
      raise

  def _receive(self, timeout_s: float, what: str) -> Any:
    """The child's next answer, within `timeout_s`."""
    if not self._connection.poll(timeout_s):
      raise TimeoutError(f'the benchmark server process did not {what} '
                         f'within {timeout_s:g} s.')
    try:
      return self._connection.recv()
    except EOFError:
      raise RuntimeError(
          f'the benchmark server process exited with code '
          f'{self._process.exitcode} before it could {what}; see its log '
          'above.') from None

  def sample(self, pipeline: str, batch_size: int, batches: int) -> float:
    """Transitions/s of `pipeline`, sampled inside the server's process.

    Args:
      pipeline: a `sampling.PIPELINES` name that reads this kind of buffer.
      batch_size: items per batch.
      batches: batches timed (after a warm-up).

    Returns:
      Transitions per second.

    Raises:
      TimeoutError: if it takes longer than 30 minutes.
    """
    self._connection.send(('sample', pipeline, batch_size, batches))
    return self._receive(_SAMPLE_TIMEOUT_S, f'sample {pipeline}')

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
    """Returns the server process; `close()` runs on leaving the block."""
    return self

  def __exit__(self, *unused) -> None:
    """Closes the server process."""
    self.close()
