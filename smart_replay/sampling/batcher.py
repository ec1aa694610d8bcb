"""The one batcher: batches drawn from weighted sources, entirely in the graph.

A batch of B windows draws how many come from each source at once, a
multinomial over the sources' shares (the same distribution as one draw per
element): each group (`ReplayInfo.source`: the buffer, or a starter mixed
in) gets its share of the batch (`shares`: 1, or the starter fraction), and
within a group each source (a shard, or the one table) its mass
(`sources.mass_of`), so a group's shards are sampled as one big table would
be. A group's probability of an element is `P(i) = mass_k / sum(mass) *
p_i`, its size the sum of its sources' sizes: the importance weights of
`dataset` use both.

One source is sampled directly: a Reverb stream, its windows batched. More
are sampled through the graph: each source's stream is *fed* by a thread of
`tf.data` (a sloppy interleave nobody reads, `filter(False)`) into a queue of
chunks of windows; one sequential map draws the counts, waits until every
chosen source has them, and takes them (a carry keeps the rest of a chunk).
No Python runs in any `tf.data` thread, so a process that ends without
closing anything exits: its iterator's destructor cancels the feeds (Reverb
closes a sampler on cancellation).

A source whose server can go down (a shard) is *watched*: the manager tells
the batcher when it stops answering (`source_down`: it gets no share of the
next batches, and a batch waiting on it is drawn again from the others) and
when it answers again (`source_up`: a new Reverb stream, in one of a few
spare feeding slots, since a stream whose server died cannot be
interrupted; a new stream whose first call a restarting server refuses is
dropped with a warning and tried again at the watcher's next round). A
batch waits at most the timeout for its sources, then its iterator raises
(naming the table and server), and the same iterator draws the next batch.

Nothing grows or waits without bound: a feed takes a room token before it
puts a chunk (a batch gives one back per chunk it takes), so it waits for
room in its own token queue, where `close()` wakes it to end; the signals
queue at most a few wakes, so a dataset nobody iterates fills nothing. The
queues of a dataset of several sources hold up to a few chunks per source
until the process ends (a destroyed queue crashed it, below): make a
dataset once per learner, not per step.
"""

import dataclasses
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import reverb
import tensorflow as tf

from smart_replay.sampling import lasting_queue
from smart_replay.sampling import sources as sources_lib
from smart_replay.sampling import windows as windows_lib
from smart_replay.utils import checks

# Streams a watched source can have at once (a dead one holds its slot until
# the dataset's iterator is destroyed).
_SLOTS = 3
# Chunks of windows each source's queue holds.
_DEPTH = 3
# Wakes queued at most by the signals (a batch drains them all at once).
_WAKES = 64
# Room tokens a source's queue can hold (its depth, plus close()'s).
_ROOMS = 64

# The info fields of a window, packed into one uint64 column per window.
_INFO = ('key', 'probability', 'table_size', 'priority', 'times_sampled')


@dataclasses.dataclass(frozen=True)
class SamplingPlan:
  """How a dataset's batches are drawn; checked once.

  Attributes:
    batch_size: windows per batch.
    timeout_s: how long a batch may wait for its sources (and a stream for
      Reverb's rate limiter) before the iterator raises.
    prefetch: batches to prefetch.
    chunk: windows per chunk a source feeds at once (several sources); None:
      the batch size, at least 16.

  Raises:
    ValueError: naming a bad value.
  """
  batch_size: int
  timeout_s: float = 60.0
  prefetch: int = 2
  chunk: Optional[int] = None

  def __post_init__(self):
    checks.positive('batch_size', self.batch_size, integer=True)
    checks.positive('timeout_s', self.timeout_s)
    if (isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int)
        or self.prefetch < 0):
      raise ValueError(f'prefetch must be an integer >= 0, got '
                       f'{self.prefetch!r}.')
    if self.chunk is not None:
      checks.positive('chunk', self.chunk, integer=True)

  @property
  def chunk_windows(self) -> int:
    """Windows per fed chunk."""
    return self.chunk or max(self.batch_size, 16)


class Drawn(NamedTuple):
  """A batch as the batcher draws it (every field `[batch]` first).

  Attributes:
    window: the windows (`windows.Window`).
    source: int32, each window's group (`ReplayInfo.source`).
    shard: int32, its source's index in its group.
    probability: float64, the group's probability of sampling it.
    size: float64, the group's size (items) when it was sampled.
  """
  window: windows_lib.Window
  source: Any
  shard: Any
  probability: Any
  size: Any


def _pack_info(info: Any) -> tf.Tensor:
  """A `SampleInfo` of `[n]` fields as uint64 `[n, 5]` (one component)."""
  return tf.stack([tf.cast(info.key, tf.uint64),
                   tf.bitcast(tf.cast(info.probability, tf.float64), tf.uint64),
                   tf.bitcast(tf.cast(info.table_size, tf.int64), tf.uint64),
                   tf.bitcast(tf.cast(info.priority, tf.float64), tf.uint64),
                   tf.cast(info.times_sampled, tf.uint64)], -1)


def _unpack_info(packed: tf.Tensor) -> reverb.SampleInfo:
  """The inverse of `_pack_info`."""
  return reverb.SampleInfo(
      key=packed[:, 0], probability=tf.bitcast(packed[:, 1], tf.float64),
      table_size=tf.bitcast(packed[:, 2], tf.int64),
      priority=tf.bitcast(packed[:, 3], tf.float64),
      times_sampled=tf.cast(packed[:, 4], tf.int32))


class Batcher:
  """Batches of windows drawn from weighted sources (module docstring).

  Args:
    sources: the sources; one, or several of groups `0..G-1`.
    windows: each group's `windows.Windows` (one window form for all).
    plan: the batch size, timeout and prefetch.
    shares: returns each group's share of a batch, float64 `[G]` (read once
      per batch, so it can follow the train step); None: one group.
    closed_message: what the iterator raises once `close()` was called.

  Raises:
    ValueError: if `sources` is empty, or its groups are not `0..G-1`.
  """

  def __init__(self, sources: Sequence[sources_lib.Source],
               windows: Dict[int, windows_lib.Windows], *,
               plan: SamplingPlan,
               shares: Optional[Callable[[], tf.Tensor]] = None,
               closed_message: str = 'the buffer was closed'):
    if not sources:
      raise ValueError('sources must hold at least one source, got [].')
    groups = sorted({s.group for s in sources})
    if groups != list(range(len(groups))) or set(windows) != set(groups):
      raise ValueError(f'the sources\' groups must be 0..G-1, each with its '
                       f'windows; got groups {groups}, windows of '
                       f'{sorted(windows)}.')
    self._sources = list(sources)
    self._windows = windows
    self._plan = plan
    self._shares = shares or (lambda: tf.ones([1], tf.float64))
    self._closed_message = closed_message
    self._num_groups = len(groups)
    # A watched source's shard -> its index.
    self._watched = {s.shard: k for k, s in enumerate(sources) if s.watched}
    self._lock = threading.Lock()
    self._closed = tf.Variable(False, trainable=False)
    if len(sources) > 1:
      self._make_state()

  # ----------------------------------------------------------------- one

  def _direct(self) -> tf.data.Dataset:
    """One source: its stream's windows, batched."""
    source, plan = self._sources[0], self._plan
    windows = self._windows[source.group]
    keep_partial = source.table.max_times_sampled > 0  # No sample dropped.
    in_flight = plan.batch_size if keep_partial else 2 * plan.batch_size
    message = source.timeout_message(plan.timeout_s)

    items = source.items(windows, in_flight=in_flight,
                         timeout_s=plan.timeout_s)  # One client for all.

    def stream(_):
      chunks = windows.chunks(items, plan.batch_size,
                              drop_remainder=not keep_partial)
      return chunks.concatenate(_raising(chunks.element_spec, message))

    closed = self._closed

    def drawn(window: windows_lib.Window) -> Drawn:
      check = tf.debugging.Assert(~closed, [self._closed_message])
      with tf.control_dependencies([check]):
        zeros = tf.zeros_like(window.info.key, tf.int32)
      return Drawn(window, zeros + source.group, zeros,
                   window.info.probability,
                   tf.cast(window.info.table_size, tf.float64))

    # After a timeout error, the next element starts a fresh stream.
    return tf.data.Dataset.range(2**62).flat_map(stream).map(drawn)

  # ---------------------------------------------------------------- many

  def _make_state(self) -> None:
    """The queues, carries and signals of several sources."""
    n, c = len(self._sources), self._plan.chunk_windows
    first = self._sources[0]
    windows = self._windows[first.group]  # Every group's windows alike.
    spec = windows.chunks(first.items(windows, in_flight=1, timeout_s=1.0),
                          c).element_spec
    self._flat_spec = ([tf.TensorSpec([c, len(_INFO)], tf.uint64), spec.mask]
                       + tf.nest.flatten(spec.data))
    self._data_spec = spec.data
    dtypes = [s.dtype for s in self._flat_spec]
    shapes = [s.shape for s in self._flat_spec]
    # A feed takes a room token before it puts a chunk, and a batch gives
    # one back per chunk it takes: a feed waits for room in `_rooms`, never
    # in a chunk queue, and close() wakes it there (no queue is ever
    # closed or drained under a consumer).
    queue = lasting_queue.LastingQueue
    self._queues = [queue(dtypes, shapes, _DEPTH) for _ in range(n)]
    self._rooms = [queue([tf.int32], [[]], _ROOMS) for _ in range(n)]
    for room in self._rooms:
      room.enqueue_many([tf.zeros([_DEPTH], tf.int32)])
    self._carry = [[tf.Variable(tf.zeros([0] + s.shape[1:], s.dtype),
                                shape=[None] + s.shape[1:], trainable=False)
                    for s in self._flat_spec] for _ in range(n)]
    self._wake = queue([tf.int32], [[]], 1 << 20)
    # Tokens to start a stream of the current generation (-1: end a slot).
    self._starts = [queue([tf.int64], [[]], 4 * _SLOTS) for _ in range(n)]
    # Tokens to start another stream of a watched source: one per watcher
    # round at most (`tick`), and one per slot to end them (`close`).
    self._retries = [queue([tf.int64], [[]], _SLOTS + 1) for _ in range(n)]
    self._generation = tf.Variable(tf.zeros([n], tf.int64), trainable=False)
    self._up = tf.Variable(tf.ones([n], tf.bool), trainable=False)
    start = [float(max(s.size or 1, 1)) for s in self._sources]
    self._masses = tf.Variable(tf.constant(start, tf.float64),
                               trainable=False)
    self._sizes = tf.Variable(tf.constant(start, tf.float64), trainable=False)
    for queue in self._starts:
      queue.enqueue([tf.constant(0, tf.int64)])

  def _feed(self, k: int) -> tf.data.Dataset:
    """What feeds source k's queue: its streams, one per generation."""
    source, plan = self._sources[k], self._plan
    windows, c = self._windows[source.group], plan.chunk_windows
    queue, wake, room = self._queues[k], self._wake, self._rooms[k]
    retry = self._retries[k]
    generation = self._generation

    closed = self._closed

    def put(window: windows_lib.Window) -> tf.Tensor:
      flat = [_pack_info(window.info), window.mask] + tf.nest.flatten(
          window.data)
      def enqueue():  # There is room: never waits.
        with tf.control_dependencies([queue.enqueue(flat)]):
          with tf.control_dependencies([wake.enqueue([k])]):
            return tf.constant(0, tf.int64)
      with tf.control_dependencies(room.dequeue()):  # Waits for room.
        return tf.cond(closed, lambda: tf.constant(0, tf.int64), enqueue)

    def tick(_) -> tf.Tensor:  # The stream timed out: the batch checks.
      with tf.control_dependencies([wake.enqueue([k])]):
        return tf.constant(0, tf.int64)

    def streams(g: tf.Tensor) -> tf.data.Dataset:
      # A stream ends at its next chunk once superseded (its source came
      # back with a new one) or closed (nothing stays blocked in a queue).
      current = lambda *_: tf.equal(generation[k], g) & ~closed
      # One Reverb client per generation: its first stream asks the server
      # for the table's signature, the next ones (after a rate limiter
      # timeout) reuse what it read.
      items = source.items(windows, in_flight=2 * c, timeout_s=plan.timeout_s)
      def one(_):
        return windows.chunks(items, c).take_while(current).map(
            put).concatenate(tf.data.Dataset.range(1).map(tick))
      if not source.watched:
        return tf.data.Dataset.range(2**62).take_while(current).flat_map(one)
      # A server that restarts can refuse a new stream's first call (Reverb
      # asks it for the table's signature; a server shutting down answers
      # UNAVAILABLE, a Reverb stream retries everything after that itself):
      # that stream is dropped with a warning, and each next one waits for a
      # retry token, which the watcher gives at most one of per round.
      def retried(attempt: tf.Tensor) -> tf.Tensor:
        with tf.control_dependencies(retry.dequeue()):
          return tf.identity(attempt)
      attempts = tf.data.Dataset.range(1).concatenate(
          tf.data.Dataset.range(1, 2**62).map(retried))
      return attempts.take_while(current).flat_map(one).ignore_errors(
          log_warning=True)

    if not source.watched:
      return streams(tf.constant(0, tf.int64))
    starts = self._starts[k]

    def started(_) -> tf.Tensor:  # The generation current when taken.
      token = starts.dequeue()[0]
      with tf.control_dependencies([token]):
        return tf.where(token < 0, token, generation[k])

    slot = lambda _: tf.data.Dataset.range(2**62).map(started).take_while(
        lambda g: g >= 0).flat_map(streams)  # -1: closed.
    return tf.data.Dataset.range(_SLOTS).interleave(
        slot, cycle_length=_SLOTS, num_parallel_calls=_SLOTS,
        deterministic=False)

  def _plan_batch(self, up: tf.Tensor):
    """`(share [n], counts [n], able)`: each source's share and count of a
    batch; `able` is False while a group with a share has no source up."""
    n, batch = len(self._sources), self._plan.batch_size
    group = [s.group for s in self._sources]
    group_share = tf.cast(self._shares(), tf.float64)
    mass = tf.where(up, self._masses, 0.0)
    group_mass = tf.math.unsorted_segment_sum(mass, group, self._num_groups)
    within = tf.math.divide_no_nan(mass, tf.gather(group_mass, group))
    share = tf.gather(group_share, group) * within
    able = ~tf.reduce_any((group_share > 0) & (group_mass <= 0))
    def draw():
      picks = tf.random.categorical(tf.math.log(share)[None], batch)[0]
      return tf.math.bincount(tf.cast(picks, tf.int32), minlength=n,
                              maxlength=n)
    counts = tf.cond(able, draw, lambda: tf.zeros([n], tf.int32))
    return share, counts, able

  def _take(self, _) -> Drawn:
    """One batch: draw, wait for the chosen sources, take (sequential)."""
    n, c = len(self._sources), self._plan.chunk_windows
    timeout = self._plan.timeout_s
    closed = tf.debugging.Assert(~self._closed, [self._closed_message])
    with tf.control_dependencies([closed]):
      drained = self._wake.dequeue_many(self._wake.size())
    with tf.control_dependencies(drained):
      began = tf.timestamp()
      up = self._up.read_value()
    carried = tf.stack([tf.shape(v[0])[0] for v in self._carry])
    messages = tf.constant([s.timeout_message(timeout)
                            for s in self._sources])
    nobody = tf.constant(
        f'WaitTimeoutError: Timed out after {timeout:g} s: no source of a '
        'group with a share of the batch answered (' + '; '.join(
            s.describe() for s in self._sources) + ' are down or were '
        'never reached).')

    def short(counts, up):
      queued = tf.stack([q.size() for q in self._queues])
      return (counts > carried + c * queued) & up

    def ready(counts, up, able):
      return able & ~tf.reduce_any(short(counts, up)) & ~tf.reduce_any(
          (counts > 0) & ~up)

    def waiting(share, counts, up, able):
      del share
      return ~ready(counts, up, able)

    def wait(share, counts, up, able):
      now_up = self._up.read_value()
      lost = ~able | tf.reduce_any((counts > 0) & ~now_up)
      share, counts, able = tf.cond(
          lost, lambda: self._plan_batch(now_up),
          lambda: (share, counts, able))
      done = ready(counts, now_up, able)
      late = tf.timestamp() - began >= timeout
      first = tf.argmax(tf.cast(short(counts, now_up), tf.int32),
                        output_type=tf.int32)
      why = tf.where(able, tf.gather(messages, first), nobody)
      checked = [tf.debugging.Assert(done | ~late, [why]),
                 tf.debugging.Assert(~self._closed, [self._closed_message])]
      with tf.control_dependencies(checked):
        woke = tf.cond(done, lambda: tf.constant(0),
                       lambda: self._wake.dequeue()[0])
      with tf.control_dependencies([woke]):
        return (tf.identity(share), tf.identity(counts),
                tf.identity(now_up), tf.identity(able))

    share, counts, able = self._plan_batch(up)
    share, counts, up, _ = tf.while_loop(waiting, wait,
                                         (share, counts, up, able))
    need = tf.maximum(0, -((carried - counts) // c))  # Chunks to dequeue.
    parts, kept = [], []
    for k, queue in enumerate(self._queues):
      taken = queue.dequeue_many(need[k])
      with tf.control_dependencies(taken):  # Room for as many chunks.
        freed = self._rooms[k].enqueue_many([tf.zeros([need[k]], tf.int32)])
      with tf.control_dependencies([freed]):
        taken = [tf.identity(t) for t in taken]
      columns = []
      for variable, chunks, spec in zip(self._carry[k], taken,
                                        self._flat_spec):
        full = tf.concat([variable.read_value(), tf.reshape(
            chunks, [-1] + spec.shape[1:].as_list())], 0)
        columns.append(full[:counts[k]])
        kept.append(variable.assign(full[counts[k]:]))
      parts.append(columns)
    with tf.control_dependencies(kept):
      flat = [tf.concat([p[i] for p in parts], 0)
              for i in range(len(self._flat_spec))]
    index = tf.repeat(tf.range(n), counts)  # Each window's source.
    info = _unpack_info(flat[0])
    window = windows_lib.Window(
        tf.nest.pack_sequence_as(self._data_spec, flat[2:]), info, flat[1])
    observed = self._observe(info, index)
    group = tf.constant([s.group for s in self._sources], tf.int32)
    shard = tf.constant([s.shard for s in self._sources], tf.int32)
    with tf.control_dependencies(observed):
      source_of = tf.gather(group, index)
      sizes = tf.math.unsorted_segment_sum(
          self._sizes.read_value(), group, self._num_groups)
    group_share = tf.gather(tf.math.unsorted_segment_sum(
        share, group, self._num_groups), source_of)
    probability = tf.math.divide_no_nan(
        tf.gather(share, index), group_share) * info.probability
    return Drawn(window, source_of, tf.gather(shard, index), probability,
                 tf.gather(sizes, source_of))

  def _observe(self, info: Any, index: tf.Tensor) -> List[tf.Operation]:
    """Refreshes each sampled source's mass and size from what its samples
    carry; a source absent from the batch keeps its values."""
    n = len(self._sources)
    present = tf.math.bincount(index, minlength=n, maxlength=n) > 0
    size = tf.cast(info.table_size, tf.float64)
    mass = tf.zeros_like(size)
    for k, source in enumerate(self._sources):  # Per table: its exponent.
      mass = tf.where(tf.equal(index, k),
                      sources_lib.mass_of(info, source.table), mass)
    seen = lambda values: tf.math.unsorted_segment_max(values, index, n)
    return [self._masses.assign(tf.where(present, seen(mass), self._masses)),
            self._sizes.assign(tf.where(present, seen(size), self._sizes))]

  def _queued(self) -> tf.data.Dataset:
    """Several sources: fed queues, one sequential map taking batches."""
    batches = tf.data.Dataset.range(2**62).map(self._take)
    spec = batches.element_spec

    def never(_) -> tf.Tensor:
      return tf.constant(False)

    def empty(_) -> Any:  # Never called: only its structure matters.
      return tf.nest.map_structure(
          lambda s: tf.zeros([0] + s.shape[1:].as_list(), s.dtype), spec)

    feeds = [self._feed(k).filter(never).map(empty)
             for k in range(len(self._sources))]
    every = tf.constant(-1, tf.int64)

    def part(j):  # 0: the batches; k + 1: source k's feed (never yields).
      dataset = batches.take(tf.where(tf.equal(j, 0), every, 0))
      for k, feed in enumerate(feeds):
        dataset = dataset.concatenate(
            feed.take(tf.where(tf.equal(j, k + 1), every, 0)))
      return dataset

    parts = len(feeds) + 1
    return tf.data.Dataset.range(parts).interleave(
        part, cycle_length=parts, num_parallel_calls=parts,
        deterministic=False)

  def dataset(self) -> tf.data.Dataset:
    """The endless dataset of `Drawn` batches.

    Returns:
      A `tf.data.Dataset`; a batch that waited longer than the timeout is
      an error of the iterator (naming what it waited on), and the same
      iterator draws the next batch.
    """
    if len(self._sources) == 1:
      return self._direct()
    return self._queued()

  # ------------------------------------------------------------- signals

  def source_down(self, shard: int) -> None:
    """The server of a watched source stopped answering: the source gets no
    share of the next batches, and a batch waiting on it is drawn again from
    the others.

    Args:
      shard: the source's shard (`Source.shard`); other shards are ignored.
    """
    k = self._watched.get(shard)
    if k is None or len(self._sources) == 1:  # One source is read directly.
      return
    with self._lock:
      self._up[k].assign(False)
      self._wake_up(k)

  def source_up(self, shard: int, *, new_stream: bool) -> None:
    """The server of a watched source answers (again): it gets its share
    back.

    Args:
      shard: the source's shard (`Source.shard`); other shards are ignored.
      new_stream: start a new Reverb stream for it (its server is back, or
        is a new instance: the old stream may never resume).
    """
    k = self._watched.get(shard)
    if k is None or len(self._sources) == 1:  # One source is read directly.
      return
    with self._lock:
      if new_stream:
        self._generation[k].assign(self._generation[k] + 1)  # Old one ends.
        # One token is enough: a slot that takes it starts a stream of the
        # generation current then (so tokens never pile up unread).
        if int(self._starts[k].size()) == 0:
          self._starts[k].enqueue([tf.constant(0, tf.int64)])
      self._up[k].assign(True)
      self._wake_up(k)

  def tick(self) -> None:
    """Wakes a batch that waits, so it can check its timeout; lets each
    watched source start one more stream (after one its server refused)."""
    if len(self._sources) > 1:
      with self._lock:
        self._wake_up(-1)
        if not bool(self._closed.numpy()):
          for k, source in enumerate(self._sources):
            if source.watched and int(self._retries[k].size()) == 0:
              self._retries[k].enqueue([tf.constant(0, tf.int64)])

  def _wake_up(self, k: int) -> None:
    """Wakes a waiting batch, unless wakes are already waiting for it (a
    dataset nobody iterates must not fill the queue)."""
    if not bool(self._closed.numpy()) and int(self._wake.size()) < _WAKES:
      self._wake.enqueue([k])

  def close(self) -> None:
    """The dataset's iterators raise `closed_message` from their next batch
    on (after the batches already drawn), and their feeds end, so nothing is
    left waiting in a queue when an iterator is destroyed (TensorFlow logs a
    warning for each such wait it cancels). Safe to call more than once."""
    with self._lock:
      if bool(self._closed.numpy()):
        return
      self._closed.assign(True)
      if len(self._sources) == 1:
        return
      self._wake.enqueue([-1])  # A waiting batch raises (room: _WAKES).
      for k, source in enumerate(self._sources):
        if source.watched:  # Every idle slot ends (room: 4 * _SLOTS), and
          for _ in range(_SLOTS):  # every retrying one (room: _SLOTS + 1).
            self._starts[k].enqueue([tf.constant(-1, tf.int64)])
            self._retries[k].enqueue([tf.constant(0, tf.int64)])
      for room in self._rooms:  # A feed waiting for room puts nothing,
        room.enqueue_many(        # and its stream ends.
            [tf.zeros([_SLOTS + 1], tf.int32)])


def _raising(element_spec: Any, message: str) -> tf.data.Dataset:
  """One element that raises `message` (an `InvalidArgumentError`) when it
  is produced: reaching it means a stream waited its timeout."""
  def fail(_):
    failed = tf.debugging.Assert(False, [message])
    with tf.control_dependencies([failed]):
      return tf.nest.map_structure(
          lambda s: tf.zeros([d or 0 for d in s.shape.as_list()], s.dtype),
          element_spec)
  return tf.data.Dataset.range(1).map(fail)
