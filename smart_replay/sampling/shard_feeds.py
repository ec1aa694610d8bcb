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

The batches drawn from the feeds reach `tf.data` through a TensorFlow queue
(`BatchPump`): a thread of its own draws them and enqueues them, and the
dataset dequeues them in the graph. No `tf.data` thread ever runs Python, so
a learner that ends without closing anything exits: a Python generator in
`tf.data` (`from_generator`) was still running when the interpreter
finalized, and the iterator's destructor then waited forever for it (it
needed the lock the finalizing thread held), or the process aborted
("FATAL: exception not rethrown").
"""

import atexit
import queue
import re
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf

from smart_replay import errors

# answer(shard) -> an id of the serving instance, or None if it is down.
Probe = Callable[[int], Optional[str]]

# Pumps and feeds whose threads run, stopped at interpreter exit: a thread
# that returns from TensorFlow or Reverb into Python while the interpreter
# finalizes aborts the process.
_RUNNING: 'weakref.WeakSet[Any]' = weakref.WeakSet()


@atexit.register
def _stop_running_threads() -> None:
  """Closes every running `BatchPump` and `ShardFeeds` and waits (5 s at
  most) for their threads, before Python finalizes."""
  deadline = time.monotonic() + 5.0
  running = list(_RUNNING)
  for each in running:
    each.close()
  for each in running:
    each.join(max(0.0, deadline - time.monotonic()))


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


def _first_line(error: Exception) -> str:
  """The first line of an error's message, without TensorFlow's function
  prefix (a Python traceback may follow it)."""
  text = error.message if isinstance(error, tf.errors.OpError) else str(error)
  return re.sub(r'^(\{\{[^}]*\}\}\s*)+', '', text.strip()).split('\n')[0]


class BatchPump:
  """Hands batches drawn in Python to `tf.data` through a TensorFlow queue.

  A thread of its own (`shard-pump`) makes `ShardFeeds` with `make_feeds`,
  draws batches from them with `draw(feeds)` and enqueues each; when
  `draw` raises (a shard's stream timed out), the error is enqueued in the
  batch's place, to be raised by the dataset for that batch, and drawing
  starts again with new feeds. `dataset()` dequeues in the graph. Closing
  the pump (its manager closed) stops the thread and the feeds; the dataset
  then raises `closed_message`.

  Args:
    make_feeds: makes the feeds of one round (not started).
    draw: yields batches (flat lists of arrays matching `signature`) from
      started feeds.
    signature: the flat `tf.TensorSpec`s of one batch.
    closed_message: what the dataset raises once the pump is closed.
    depth: batches the queue holds.
  """

  def __init__(self, make_feeds: Callable[[], ShardFeeds],
               draw: Callable[[ShardFeeds], Iterator[Sequence[Any]]],
               signature: Sequence[tf.TensorSpec], *, closed_message: str,
               depth: int = 2):
    self._make_feeds, self._draw = make_feeds, draw
    self._signature = list(signature)
    self._closed_message = closed_message
    self._depth = depth
    # One slot more than the pump fills: room for the closing error.
    self._queue = tf.queue.FIFOQueue(
        depth + 1, [spec.dtype for spec in self._signature] + [tf.string])
    self._empty = [np.zeros([d or 0 for d in spec.shape],
                            spec.dtype.as_numpy_dtype)
                   for spec in self._signature]
    self._stop = threading.Event()
    self._lock = threading.Lock()
    self._feeds: Optional[ShardFeeds] = None
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name='shard-pump')

  def start(self) -> 'BatchPump':
    """Starts the pump's thread.

    Returns:
      The pump itself.
    """
    _RUNNING.add(self)
    self._thread.start()
    return self

  def dataset(self) -> tf.data.Dataset:
    """The endless dataset of the pump's batches (flat tuples); an error
    enqueued in a batch's place is raised as a `tf.errors.OpError` with its
    message, and the next element is the next batch."""
    signature, queue_ = self._signature, self._queue

    def take(_):
      *flat, error = queue_.dequeue()
      failed = tf.debugging.Assert(tf.equal(error, ''), [error])
      with tf.control_dependencies([failed]):
        return tuple(tf.ensure_shape(t, spec.shape)
                     for t, spec in zip(flat, signature))

    return tf.data.Dataset.range(2**62).map(take)

  def _run(self) -> None:
    """The pump's thread: rounds of feeds until closed. Any error of a round
    is enqueued for the dataset to raise (so it never waits for a thread that
    died), and the next round starts new feeds."""
    while not self._stop.is_set():
      feeds = None
      try:
        feeds = self._make_feeds()
        with self._lock:
          if self._stop.is_set():
            return
          self._feeds = feeds
        feeds.start()
        for batch in self._draw(feeds):
          if not self._put(list(batch), ''):
            return
      except Exception as e:  # pylint: disable=broad-except
        if self._stop.is_set() or not self._put(self._empty, _first_line(e)):
          return
      finally:
        if feeds is not None:
          feeds.close()

  def _put(self, flat: List[Any], error: str) -> bool:
    """Enqueues once the queue has room (keeping one slot free); False if
    the pump was closed meanwhile."""
    wait = 0.0005
    while not self._stop.is_set():
      if int(self._queue.size()) < self._depth:
        self._queue.enqueue(flat + [error])
        return True
      self._stop.wait(wait)
      wait = min(2 * wait, 0.02)
    return False

  def status(self) -> List[Dict[str, Any]]:
    """Per shard: whether the current feeds see it up, and how often they
    saw it go down (`ShardFeeds.status`); empty before the first round."""
    feeds = self._feeds
    return feeds.status() if feeds is not None else []

  def close(self) -> None:
    """Stops the pump and its feeds; the dataset raises `closed_message`
    after the batches already queued. Safe to call more than once."""
    with self._lock:
      if self._stop.is_set():
        return
      self._stop.set()
      feeds = self._feeds
    _RUNNING.discard(self)
    if feeds is not None:
      feeds.close()
    self._thread.join(5.0)
    try:
      if not self._thread.is_alive():  # Else its put may still take a slot.
        self._queue.enqueue(self._empty + [self._closed_message])
    finally:
      self._queue.close(cancel_pending_enqueues=True)

  def join(self, timeout_s: float) -> None:
    """Waits up to `timeout_s` for the pump's and its feeds' threads.

    Args:
      timeout_s: seconds.
    """
    deadline = time.monotonic() + timeout_s
    self._thread.join(timeout_s)
    feeds = self._feeds
    if feeds is not None:
      feeds.join(max(0.0, deadline - time.monotonic()))
