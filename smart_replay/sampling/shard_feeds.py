"""Each shard's samples, fed by its own thread, and which shards are up.

Reverb's sampler cannot be interrupted: once the server it reads from dies,
the next sample it is asked for waits forever, even after the server comes
back on the same port (a new server is a new stream). So a sharded dataset
never asks a shard's stream from the learner's thread. Each shard's stream
runs in its own thread (`ShardFeeds`), which puts chunks of samples into a
small queue; a monitor asks every shard every `check_s` whether it is up
(and which server instance it is). A shard that does not answer is marked
down (a warning names it; `down_events` counts it) and gets no share of the
next batches; a batch waiting on it is drawn again from the others. When it
answers again, or answers as a new instance (restarted between two checks),
it gets a new stream in a new thread; a thread still blocked in the dead
stream is abandoned (a daemon; what it might still produce is dropped).
"""

import atexit
import queue
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf

from smart_replay import errors

# answer(shard) -> an id of the serving instance, or None if it is down.
Probe = Callable[[int], Optional[str]]

# Feeds whose threads run, stopped at interpreter exit: a feeding thread
# still inside Reverb's sampler while Python finalizes makes the process
# hang in TensorFlow's teardown (seen when a script ends without closing
# its manager).
_RUNNING: 'weakref.WeakSet[ShardFeeds]' = weakref.WeakSet()


@atexit.register
def _stop_running_feeds() -> None:
  """Closes every running `ShardFeeds` and waits (5 s at most) for their
  threads, before Python finalizes."""
  deadline = time.monotonic() + 5.0
  running = list(_RUNNING)
  for feeds in running:
    feeds.close()
  for feeds in running:
    feeds.join(max(0.0, deadline - time.monotonic()))


class ShardFeeds:
  """Per-shard feeding threads and the monitor (module docstring).

  Args:
    streams: `streams[k]()` makes shard k's dataset of sample chunks.
    where: each shard's address, for messages.
    probe: asks a shard whether it is up.
    check_s: seconds between two probes of every shard.
    timeout_s: how long `take` waits while every shard needed is down.
    depth: chunks each shard's queue holds.
  """

  def __init__(self, streams: Sequence[Callable[[], tf.data.Dataset]],
               where: Sequence[str], *, probe: Probe, check_s: float,
               timeout_s: float, depth: int = 2):
    self._streams, self.where = list(streams), list(where)
    self._probe, self._check_s, self._timeout_s = probe, check_s, timeout_s
    self._depth = depth
    n = len(self._streams)
    self.up = np.zeros(n, bool)
    self.down_events = [0] * n
    self._instances: List[Optional[str]] = [None] * n
    self._generation = [0] * n
    self._queues = [queue.Queue(depth) for _ in range(n)]
    self._pending: List[List[Any]] = [[] for _ in range(n)]
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._threads: List[threading.Thread] = []

  def start(self) -> 'ShardFeeds':
    """Probes every shard, starts the feeds of those up and the monitor.

    Returns:
      The feeds themselves.
    """
    _RUNNING.add(self)
    for k in range(len(self._streams)):
      self._instances[k] = self._probe(k)
      if self._instances[k] is not None:
        self._restart(k)
      else:
        self._down(k, 'does not answer')
    self._monitor = threading.Thread(target=self._watch, daemon=True,
                                     name='shard-monitor')
    self._monitor.start()
    self._threads.append(self._monitor)
    return self

  def _restart(self, k: int) -> None:
    """Gives shard k a new stream in a new thread."""
    with self._lock:
      self._generation[k] += 1
      generation = self._generation[k]
      self._queues[k] = queue.Queue(self._depth)
      self._pending[k] = []
      self.up[k] = True
    thread = threading.Thread(target=self._feed, args=(k, generation),
                              daemon=True, name=f'shard-feed-{k}')
    thread.start()
    self._threads = [t for t in self._threads if t.is_alive()] + [thread]

  def _down(self, k: int, why: str) -> None:
    with self._lock:
      self.up[k] = False
      self.down_events[k] += 1
      self._generation[k] += 1  # The feed's thread stops (or is abandoned).
    logging.warning('Shard %d (%s) %s: sampling goes on from the other '
                    'shards without it (down %d time(s) so far).', k,
                    self.where[k], why, self.down_events[k])

  def _feed(self, k: int, generation: int) -> None:
    """Shard k's thread: puts its stream's chunks into its queue."""
    try:
      chunks = iter(self._streams[k]())
      while not self._stop.is_set() and self._generation[k] == generation:
        chunk = tf.nest.map_structure(lambda t: t.numpy(), next(chunks))
        self._put(k, generation, chunk)
    except Exception as e:  # pylint: disable=broad-except
      self._put(k, generation, e)  # Raised by `take`, in the learner.

  def _put(self, k: int, generation: int, item: Any) -> None:
    target = self._queues[k]
    while not self._stop.is_set() and self._generation[k] == generation:
      try:
        target.put(item, timeout=0.2)
        return
      except queue.Full:
        continue

  def _watch(self) -> None:
    """The monitor: marks shards down and up, restarts their streams."""
    while not self._stop.wait(self._check_s):
      for k in range(len(self._streams)):
        instance = self._probe(k)
        if instance is None:
          if self.up[k]:
            self._down(k, 'does not answer')
          continue
        if not self.up[k] or instance != self._instances[k]:
          logging.warning('Shard %d (%s) is serving again%s; its samples '
                          'are drawn again.', k, self.where[k],
                          ' (a new instance: it restarted)'
                          if self.up[k] else '')
          if self.up[k]:
            self.down_events[k] += 1
          self._instances[k] = instance
          self._restart(k)

  def take(self, k: int, count: int) -> Optional[List[Any]]:
    """`count` samples of shard k, as slices of its chunks.

    Args:
      k: the shard.
      count: samples wanted (> 0).

    Returns:
      The slices, or None if the shard went down meanwhile (draw again).

    Raises:
      WaitTimeoutError: if the shard's stream timed out (names its table).
      tf.errors.OpError: if its stream failed otherwise.
      ManagerStateError: if the feeds were closed.
    """
    parts, generation = [], self._generation[k]
    while count > 0:
      self._check_open()
      if not self.up[k] or self._generation[k] != generation:
        return None
      if not self._pending[k]:
        try:
          item = self._queues[k].get(timeout=0.1)
        except queue.Empty:
          continue
        if isinstance(item, Exception):
          raise item
        self._pending[k] = [item, 0]
      chunk, offset = self._pending[k]
      size = len(tf.nest.flatten(chunk)[0])
      used = min(count, size - offset)
      parts.append(tf.nest.map_structure(
          lambda a, o=offset, u=used: a[o:o + u], chunk))
      count -= used
      self._pending[k] = [chunk, offset + used] if offset + used < size else []
    return parts

  def wait_for_any(self) -> np.ndarray:
    """The shards that are up, once at least one is.

    Returns:
      A bool mask of the shards up.

    Raises:
      WaitTimeoutError: if none was up for `timeout_s` (names them).
      ManagerStateError: if the feeds were closed.
    """
    deadline = time.monotonic() + self._timeout_s
    while not self.up.any():
      self._check_open()
      if time.monotonic() > deadline:
        raise errors.WaitTimeoutError(
            f'no shard of the sharded buffer answered for {self._timeout_s:g}'
            f' s (sample_timeout_s): {self.where} are all down.')
      time.sleep(0.1)
    return self.up.copy()

  def _check_open(self) -> None:
    if self._stop.is_set():
      raise errors.ManagerStateError(
          f'the sharded buffer over {self.where} was closed (its manager '
          'closed); make a new dataset from a new manager.')

  def status(self) -> List[Dict[str, Any]]:
    """Per shard: whether it is up and how often it went down."""
    return [{'address': address, 'up': bool(up), 'down_events': events}
            for address, up, events in zip(self.where, self.up,
                                           self.down_events)]

  def close(self) -> None:
    """Stops the monitor and the feeding threads (a thread blocked in a
    dead shard's stream stays blocked; it is a daemon)."""
    self._stop.set()
    _RUNNING.discard(self)

  def join(self, timeout_s: float) -> None:
    """Waits up to `timeout_s` in all for the threads to end (after
    `close`).

    Args:
      timeout_s: seconds.
    """
    deadline = time.monotonic() + timeout_s
    for thread in list(self._threads):
      thread.join(max(0.0, deadline - time.monotonic()))
