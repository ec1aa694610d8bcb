"""One side of the Atari benchmark, measured alone in its own process.

A side is a replay buffer in this process (an in-process Reverb server, as
a learner beside its buffer has it) fed with the cached Atari stream:

* 'stock': TF-Agents and Reverb as their examples set them up: a uniform
  table with a FIFO remover, max_size 1e6, `MinSize(1)`; a
  `ReverbReplayBuffer` and a `ReverbAddTrajectoryObserver(sequence_length=2,
  stride_length=1)`; sampled with `as_dataset(sample_batch_size=32,
  num_steps=2)`;
* 'ours': `ReplayBufferManager(data_spec, capacity=...,
  sequence_length=2)` without any option: the frame stack is found by its
  shape and stored in zstd, one item per window of 2 steps;
* 'ours_blocks': the same with packed items,
  `table_configs=[TableConfig(block_length=64)]`;
* 'ours_zlib', 'ours_blocks_zlib': both with
  `FrameStack('observation', axis=..., codec='zlib')` (blocks of 32), as they
  were before zstd, for reference;
* 'ours_noframes': one item per window with `frame_stack=False` (whole
  stacks), for reference;
* 'ours_no_journal': 'ours' without its write-ahead journal
  (`journal='off'`; the default 'auto' journals a frame-stacked buffer's
  cells, synced every second), for reference: the journal's cost.

Every side stores the same stream with its frames on the workload's stack
axis: `uint8[4, 84, 84]` (0) or TF-Agents' `uint8[84, 84, 4]` (-1).

`measure` writes the stream, reading the process's RSS at the size-curve
points, the half and the end (after a flush and a short settle, left out of
the insert time); samples for `sample_seconds`; checkpoints; closes the
buffer; and restores it (stock: a new server on the checkpoint root; ours:
`ReplayBufferManager.from_checkpoint(dir)` and `load_replay_buffer()`).
"""

import gc
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Tuple

import reverb
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.replay_buffers import reverb_utils

from smart_replay import FrameStack
from smart_replay import ReplayBufferManager
from smart_replay import TableConfig
from smart_replay.utils import progress_log
from smart_replay_benchmarks import atari_frames

SIDES = ('stock', 'ours', 'ours_blocks', 'ours_zlib', 'ours_blocks_zlib',
         'ours_noframes', 'ours_no_journal')
# The label of each side in tables and charts.
LABELS = {'stock': 'stock TF-Agents', 'ours': 'ours, per-window',
          'ours_blocks': 'ours, packed items (64)',
          'ours_zlib': 'ours, per-window, zlib',
          'ours_blocks_zlib': 'ours, packed items (32), zlib',
          'ours_noframes': 'ours, frame_stack=False',
          'ours_no_journal': 'ours, per-window, no journal'}
CAPACITY = 10**6
SEQUENCE_LENGTH = 2
BATCH_SIZE = 32
# zstd blocks: a window inflates only its groups, so a long block costs no
# sampling time and spreads Reverb's ~1.5 KB per item over 63 windows. The
# zlib reference keeps the 32 steps it was measured with before zstd.
BLOCK_LENGTH = 64
ZLIB_BLOCK_LENGTH = 32
STOCK_TABLE = 'uniform_table'
_SETTLE_S = 0.5  # Lets Reverb's threads finish before RSS is read.
_WARMUP_BATCHES = 10


def rss() -> int:
  """This process's resident memory in bytes (/proc/self/statm)."""
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def folder_bytes(path: str) -> int:
  """Bytes of every file under the folder `path`."""
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(path) for name in names)


def write(side: str, observe: Callable[[Any], None], flush: Callable[[], None],
          steps: List[Any], marks: Iterable[int]) -> Dict[str, Any]:
  """Writes `steps` through `observe`; reads the RSS at every mark.

  At each mark (a count of steps written) the writer is flushed, then after
  `_SETTLE_S` the RSS is read; the settle and the reading are left out of
  the insert time, the flush is not.

  Args:
    side: the side's name, for the progress lines.
    observe: the observer.
    flush: flushes the observer.
    steps: the stream.
    marks: counts of steps written at which to read the RSS (the last one
      should be `len(steps)`).

  Returns:
    `{'base_rss', 'rss': {mark: bytes}, 'insert_seconds'}`.
  """
  marks = sorted(set(marks))
  readings, paused = {}, 0.0
  gc.collect()
  base = rss()
  start = time.perf_counter()
  with progress_log.ProgressLog(f'write {side}', len(steps),
                                'steps') as progress:
    for index, step in enumerate(steps):
      observe(step)
      done = index + 1
      if marks and done == marks[0]:
        marks.pop(0)
        flush()
        pause = time.perf_counter()
        time.sleep(_SETTLE_S)
        readings[done] = rss()
        paused += time.perf_counter() - pause
      progress.update(done)
  return {'base_rss': base, 'rss': readings,
          'insert_seconds': time.perf_counter() - start - paused}


def sample_rate(dataset: Any, seconds: float) -> Tuple[float, int]:
  """Windows per second of `next()` on `dataset` for `seconds`.

  Args:
    dataset: a dataset of batches of `BATCH_SIZE` windows.
    seconds: how long to time, after `_WARMUP_BATCHES` batches.

  Returns:
    (windows/s, batches timed).
  """
  iterator = iter(dataset)
  try:
    for _ in range(_WARMUP_BATCHES):
      next(iterator)
    start = time.perf_counter()
    batches = 0
    while time.perf_counter() - start < seconds:
      next(iterator)
      batches += 1
    return batches * BATCH_SIZE / (time.perf_counter() - start), batches
  finally:
    del iterator  # Before the buffer closes.
    gc.collect()


def _stock_server(root: str):
  """A Reverb server with TF-Agents' usual uniform table, checkpointing into
  (and restoring the newest checkpoint of) `root`."""
  table = reverb.Table(
      STOCK_TABLE, max_size=CAPACITY, sampler=reverb.selectors.Uniform(),
      remover=reverb.selectors.Fifo(),
      rate_limiter=reverb.rate_limiters.MinSize(1))
  return reverb.Server(
      [table], checkpointer=reverb.checkpointers.DefaultCheckpointer(root))


def _items(server_address: str, table: str) -> int:
  """Items in `table` of the server at `server_address`."""
  return reverb.Client(server_address).server_info()[table].current_size


def _measure_stock(steps, marks, sample_seconds, work, stack_axis
                   ) -> Dict[str, Any]:
  """Writes, samples, checkpoints and restores the stock buffer."""
  root = os.path.join(work, 'reverb')
  server = _stock_server(root)
  try:
    replay_buffer = reverb_replay_buffer.ReverbReplayBuffer(
        atari_frames.data_spec(stack_axis), sequence_length=SEQUENCE_LENGTH,
        table_name=STOCK_TABLE, local_server=server)
    observer = reverb_utils.ReverbAddTrajectoryObserver(
        replay_buffer.py_client, STOCK_TABLE, sequence_length=SEQUENCE_LENGTH,
        stride_length=1)
    result = write('stock', observer, observer.flush, steps, marks)
    address = f'localhost:{server.port}'
    result['items'] = _items(address, STOCK_TABLE)
    result['sample_windows_per_s'], result['sample_batches'] = sample_rate(
        replay_buffer.as_dataset(sample_batch_size=BATCH_SIZE,
                                 num_steps=SEQUENCE_LENGTH), sample_seconds)
    observer.close()
    start = time.perf_counter()
    path = replay_buffer.py_client.checkpoint()
    result['checkpoint_seconds'] = time.perf_counter() - start
    result['checkpoint_bytes'] = folder_bytes(path)
  finally:
    server.stop()
  del replay_buffer, observer, server
  gc.collect()
  start = time.perf_counter()
  restored = _stock_server(root)  # Loads the newest checkpoint in `root`.
  try:
    result['restore_seconds'] = time.perf_counter() - start
    result['restored_items'] = _items(f'localhost:{restored.port}',
                                      STOCK_TABLE)
  finally:
    restored.stop()
  return result


def _measure_ours(side, steps, marks, sample_seconds, work, stack_axis
                  ) -> Dict[str, Any]:
  """Writes, samples, checkpoints and restores one of our buffers."""
  options = {}  # 'ours': none, the frame stack is found.
  if side == 'ours_blocks':
    options['table_configs'] = [TableConfig(block_length=BLOCK_LENGTH)]
  if side == 'ours_blocks_zlib':
    options['table_configs'] = [TableConfig(block_length=ZLIB_BLOCK_LENGTH)]
  if side.endswith('_zlib'):
    options['frame_stack'] = FrameStack('observation', axis=stack_axis,
                                        codec='zlib')
  if side == 'ours_noframes':
    options['frame_stack'] = False
  if side == 'ours_no_journal':
    options['journal'] = 'off'  # 'auto' journals the cells.
  buffer_dir = os.path.join(work, 'buffer')
  manager = ReplayBufferManager(
      atari_frames.data_spec(stack_axis), capacity=CAPACITY,
      checkpoint_dir=buffer_dir, sequence_length=SEQUENCE_LENGTH, **options)
  try:
    _, observer = manager.create_replay_buffer()
    result = write(side, observer, manager.flush, steps, marks)
    table = manager.table_configs[0].name
    result['items'] = _items(manager.server_address, table)
    result['sample_windows_per_s'], result['sample_batches'] = sample_rate(
        manager.get_dataset(batch_size=BATCH_SIZE, num_steps=SEQUENCE_LENGTH),
        sample_seconds)
    start = time.perf_counter()
    path = manager.checkpoint()
    result['checkpoint_seconds'] = time.perf_counter() - start
    result['checkpoint_bytes'] = folder_bytes(path)
  finally:
    manager.close()
  del manager, observer
  gc.collect()
  start = time.perf_counter()
  restored = ReplayBufferManager.from_checkpoint(buffer_dir)
  try:
    restored.load_replay_buffer()
    result['restore_seconds'] = time.perf_counter() - start
    result['restored_items'] = _items(restored.server_address, table)
  finally:
    restored.close()
  return result


def measure(side: str, frames_folder: str, steps: int, marks: Iterable[int],
            sample_seconds: float, work: str, stack_axis: int = 0
            ) -> Dict[str, Any]:
  """Measures one side on the cached stream (call it in a fresh process).

  Args:
    side: a `SIDES` name.
    frames_folder: the `atari_frames.cache_folder` of the stream.
    steps: steps written (the stream's first `steps`).
    marks: counts of steps at which the RSS is read; `steps // 2` and
      `steps` are always among them.
    sample_seconds: seconds of sampling timed.
    work: an empty folder for the side's checkpoints.
    stack_axis: the observation's frames on axis 0 or -1
      (`atari_frames.data_spec`).

  Returns:
    `{'steps', 'base_rss', 'rss': {steps written: bytes}, 'insert_seconds',
    'insert_steps_per_s', 'items', 'sample_windows_per_s', 'sample_batches',
    'checkpoint_seconds', 'checkpoint_bytes', 'restore_seconds',
    'restored_items'}`.

  Raises:
    ValueError: if `side` is unknown.
  """
  if side not in SIDES:
    raise ValueError(f'unknown side {side!r}; expected one of {SIDES}.')
  stream = atari_frames.trajectories(atari_frames.load(frames_folder, steps),
                                     stack_axis)
  marks = set(marks) | {steps // 2, steps}
  if side == 'stock':
    result = _measure_stock(stream, marks, sample_seconds, work, stack_axis)
  else:
    result = _measure_ours(side, stream, marks, sample_seconds, work,
                           stack_axis)
  result['steps'] = steps
  result['insert_steps_per_s'] = steps / result['insert_seconds']
  return result
