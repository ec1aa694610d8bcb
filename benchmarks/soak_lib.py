"""Memory soak: does RSS stay flat while a buffer is written, sampled and saved?

One real buffer runs in this process (a `ReplayBufferManager` with the
benchmark's step spec, its table filled to capacity first, so a full buffer
should mean flat memory):

* an observer thread writes steps at `write_steps_per_s`;
* a learner loop takes batches of `manager.get_dataset(batch_size,
  num_steps=2)` as fast as it can, inside a `tf.function` as
  `tf_agents.train.Learner` does (`loop='eager'`: Python `next()`), or of
  TF-Agents' `as_dataset` / a bare `reverb.TrajectoryDataset` (`sampler`);
* a thread calls `manager.checkpoint()` every `checkpoint_every_s`.

RSS is read every `rss_every_s`; after `warmup_s` a least-squares line is
fitted to it, and the run passes if the slope is at most
`max_growth_mb_per_min`. Beside RSS it records glibc's counters
(`mallinfo2`: bytes in use vs bytes freed but kept in its arenas) and
Python's allocated blocks, which tell a leak (in-use bytes or Python objects
grow) from allocator retention (free bytes grow, then level off).

TensorFlow, Reverb and smart_replay are imported when a soak runs, not with
this module, so that a binary can set `TF_CPP_MIN_LOG_LEVEL` first.
"""

import ctypes
import dataclasses
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

MODES = frozenset({'write', 'sample', 'checkpoint'})
SAMPLERS = ('ours', 'stock', 'reverb')
LOOPS = ('function', 'eager')
CHECKPOINT_WITH = ('manager', 'reverb')

_LIBC = ctypes.CDLL('libc.so.6')


class _MallInfo2(ctypes.Structure):
  _fields_ = [(name, ctypes.c_size_t) for name in (
      'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks',
      'uordblks', 'fordblks', 'keepcost')]


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one soak runs, and its pass bound.

  Attributes:
    duration_s: seconds measured (after the prefill and the warm-up).
    warmup_s: seconds run first and left out of the fit.
    mode: what runs: any of `MODES` ('write', 'sample', 'checkpoint').
    sampler: 'ours' (`manager.get_dataset`), 'stock' (TF-Agents'
      `as_dataset`) or 'reverb' (a bare batched `reverb.TrajectoryDataset`).
    loop: 'function' (batches taken inside a `tf.function`) or 'eager'
      (`next(iterator)` from Python).
    batches_per_call: batches per `tf.function` call (loop 'function').
    batch_size: items per batch.
    write_steps_per_s: the observer's write rate.
    capacity: items the table holds (filled before the clock starts).
    observation_size: floats per observation.
    checkpoint_every_s: seconds between checkpoints.
    checkpoint_with: 'manager' (`manager.checkpoint()`) or 'reverb' (the
      bare `Client.checkpoint()`).
    malloc_trim_every_s: call glibc `malloc_trim(0)` this often (0: never).
    rss_every_s: seconds between RSS readings.
    max_growth_mb_per_min: pass bound on the fitted RSS slope.
  """
  duration_s: float = 120.0
  warmup_s: float = 60.0
  mode: FrozenSet[str] = MODES
  sampler: str = 'ours'
  loop: str = 'function'
  batches_per_call: int = 1
  batch_size: int = 64
  write_steps_per_s: float = 500.0
  capacity: int = 20_000
  observation_size: int = 32
  checkpoint_every_s: float = 20.0
  checkpoint_with: str = 'manager'
  malloc_trim_every_s: float = 0.0
  rss_every_s: float = 2.0
  max_growth_mb_per_min: float = 5.0

  def __post_init__(self):
    object.__setattr__(self, 'mode', frozenset(self.mode))
    if not self.mode or not self.mode <= MODES:
      raise ValueError('mode must be one or more of checkpoint, sample, '
                       f'write; got {sorted(self.mode)}')
    for name, allowed in (('sampler', SAMPLERS), ('loop', LOOPS),
                          ('checkpoint_with', CHECKPOINT_WITH)):
      if getattr(self, name) not in allowed:
        raise ValueError(f'{name} must be one of {allowed}, got '
                         f'{getattr(self, name)!r}')


def rss_mb() -> float:
  """This process's resident set size (VmRSS).

  Returns:
    The RSS in MB, or NaN where /proc/self/status has no VmRSS.
  """
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024
  return float('nan')


def malloc_mb() -> Optional[Tuple[float, float]]:
  """glibc malloc's counters of this process.

  Returns:
    (MB in use, MB freed but kept), or None if malloc is replaced
    (LD_PRELOAD) or glibc has no `mallinfo2`.
  """
  if ('malloc' in os.environ.get('LD_PRELOAD', '') or
      not hasattr(_LIBC, 'mallinfo2')):
    return None
  _LIBC.mallinfo2.restype = _MallInfo2
  info = _LIBC.mallinfo2()
  return (info.uordblks + info.hblkhd) / 2**20, info.fordblks / 2**20


def fit_slope(readings: Sequence[Tuple[float, Optional[float]]],
              start_s: float) -> float:
  """Least-squares slope, per minute, of the readings from `start_s` on.

  Args:
    readings: (seconds, value) pairs; a None value is left out.
    start_s: the first second fitted.

  Returns:
    The slope in value units per minute, or NaN with fewer than 3 points.
  """
  points = [(t, v) for t, v in readings if t >= start_s and v is not None]
  if len(points) < 3:
    return float('nan')
  t, v = np.array(points, dtype=float).T
  return float(np.polyfit(t / 60, v, 1)[0])


def _dataset(manager, sampler: str, batch_size: int):
  """The sampling pipeline under test."""
  import reverb  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if sampler == 'ours':
    return manager.get_dataset(batch_size=batch_size, num_steps=2)
  if sampler == 'stock':
    return manager.replay_buffer.as_dataset(sample_batch_size=batch_size,
                                            num_steps=2)
  spec = manager.data_spec
  return reverb.TrajectoryDataset(
      manager.server_address, manager.table_configs[0].name,
      tf.nest.map_structure(lambda s: s.dtype, spec),
      tf.nest.map_structure(lambda s: tf.TensorShape([2] + s.shape), spec),
      max_in_flight_samples_per_worker=2 * batch_size,
      num_workers_per_iterator=2,
      rate_limiter_timeout_ms=60_000).batch(batch_size, drop_remainder=True)


def run(settings: Settings) -> Dict[str, Any]:
  """Runs one soak.

  Args:
    settings: what runs, for how long, and the pass bound.

  Returns:
    The result (see `result`): the settings, the counts, the fitted slopes,
    the readings and `passed`.

  Raises:
    Exception: the first failure of the writer or checkpoint thread (the
      buffer is closed and removed first).
  """
  import reverb  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import smart_replay  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from smart_replay_benchmarks import workload as workload_lib

  s = settings
  spec = workload_lib.data_spec(s.observation_size)
  steps = workload_lib.make_steps(workload_lib.Workload(
      steps=1000, repeats=1, observation_size=s.observation_size,
      num_envs=1), 0, 1000)  # Five 200-step episodes, written round and round.
  work = tempfile.mkdtemp(prefix='soak_')
  manager = smart_replay.ReplayBufferManager(
      spec, capacity=s.capacity, sequence_length=2,
      checkpoint_dir=os.path.join(work, 'buffer'))
  stop = threading.Event()
  counts = {'steps': 0, 'batches': 0, 'checkpoints': 0}
  failures = []

  def thread(body):
    def guarded():
      try:
        body()
      except Exception as e:  # pylint: disable=broad-except
        failures.append(e)
        stop.set()
    return threading.Thread(target=guarded, daemon=True)

  def write():
    start = time.monotonic()
    while not stop.is_set():
      observer(steps[counts['steps'] % len(steps)])
      counts['steps'] += 1
      due = start + counts['steps'] / s.write_steps_per_s
      time.sleep(max(0.0, due - time.monotonic()))

  def checkpoint():
    client = reverb.Client(manager.server_address)
    while not stop.wait(s.checkpoint_every_s):
      if s.checkpoint_with == 'manager':
        manager.checkpoint()
      else:
        shutil.rmtree(client.checkpoint(), ignore_errors=True)
      counts['checkpoints'] += 1

  per_call = s.batches_per_call if s.loop == 'function' else 1

  @tf.function
  def take_in_function(iterator):
    total = tf.constant(0, tf.int64)
    for _ in tf.range(per_call):  # Reads every tensor, as a train step does.
      total += tf.add_n([tf.size(t, tf.int64)
                         for t in tf.nest.flatten(next(iterator))])
    return total

  readings, malloc, blocks = [], [], []
  threads = []
  try:
    _, observer = manager.create_replay_buffer()
    for i in range(s.capacity + s.capacity // 199 + 1):  # A full table.
      observer(steps[i % len(steps)])
    observer.flush()
    if 'write' in s.mode:
      threads.append(thread(write))
    if 'checkpoint' in s.mode:
      threads.append(thread(checkpoint))
    for t in threads:
      t.start()
    iterator = None
    if 'sample' in s.mode:
      iterator = iter(_dataset(manager, s.sampler, s.batch_size))
    take = take_in_function if s.loop == 'function' else next
    start = time.monotonic()
    total_s = s.warmup_s + s.duration_s
    next_reading = next_log = next_trim = start
    while not stop.is_set():
      now = time.monotonic()
      if now >= next_reading:
        readings.append((now - start, rss_mb()))
        malloc.append((now - start, malloc_mb()))
        blocks.append((now - start, sys.getallocatedblocks()))
        next_reading += s.rss_every_s
      if now >= next_log:
        print(f'[{now - start:4.0f} s / {total_s:.0f} s, ETA '
              f'{start + total_s - now:3.0f} s] '
              f"{'warm-up' if now - start < s.warmup_s else 'measuring'}: "
              f'RSS {readings[-1][1]:.1f} MB, {counts["batches"]} batches, '
              f'{counts["steps"]} steps, {counts["checkpoints"]} checkpoints',
              flush=True)
        next_log += 15
      if s.malloc_trim_every_s and now >= next_trim:
        _LIBC.malloc_trim(0)
        next_trim += s.malloc_trim_every_s
      if now - start >= total_s:
        break
      if iterator is None:
        time.sleep(max(0.0, min(next_reading, next_log) - now))
      else:
        take(iterator)
        counts['batches'] += per_call
  finally:
    stop.set()
    for t in threads:
      t.join(120)
    try:
      manager.close()
    finally:
      shutil.rmtree(work, ignore_errors=True)
  if failures:
    raise failures[0]
  return result(settings, counts, readings, malloc, blocks,
                tensorflow_version=tf.__version__)


def result(settings: Settings, counts: Dict[str, int],
           readings: List[Tuple[float, float]],
           malloc: List[Tuple[float, Optional[Tuple[float, float]]]],
           blocks: List[Tuple[float, int]],
           tensorflow_version: str) -> Dict[str, Any]:
  """The verdict and the fitted slopes of a soak's readings.

  Args:
    settings: the soak's settings.
    counts: {'steps', 'batches', 'checkpoints'} done.
    readings: (seconds, RSS MB) pairs.
    malloc: (seconds, `malloc_mb()`) pairs.
    blocks: (seconds, Python's allocated blocks) pairs.
    tensorflow_version: the TensorFlow version, for the record.

  Returns:
    The settings (`mode` a sorted list), the environment, the counts, the RSS
    at the start and end of the measured span and its peak, the slopes per
    minute (RSS, its second half, glibc in use and freed-but-kept, Python
    blocks), the readings, and `passed`.
  """
  warmup, elapsed = settings.warmup_s, readings[-1][0]
  measured = [r for t, r in readings if t >= warmup]
  slope = fit_slope(readings, warmup)
  batches_per_min = counts['batches'] / elapsed * 60
  blocks_per_min = fit_slope(blocks, warmup)
  return {
      'settings': dict(dataclasses.asdict(settings),
                       mode=sorted(settings.mode)),
      'env': {k: os.environ[k] for k in ('MALLOC_ARENA_MAX', 'LD_PRELOAD')
              if k in os.environ},
      'python': sys.version.split()[0], 'tensorflow': tensorflow_version,
      'counts': counts, 'elapsed_s': elapsed,
      'rss_start_mb': measured[0], 'rss_end_mb': measured[-1],
      'rss_peak_mb': max(r for _, r in readings),
      'slope_mb_per_min': slope,
      'slope_second_half_mb_per_min': fit_slope(
          readings, warmup + (elapsed - warmup) / 2),
      'malloc_in_use_mb_per_min': fit_slope(
          [(t, m and m[0]) for t, m in malloc], warmup),
      'malloc_free_kept_mb_per_min': fit_slope(
          [(t, m and m[1]) for t, m in malloc], warmup),
      'python_blocks_per_min': blocks_per_min,
      'python_blocks_per_batch': (blocks_per_min / batches_per_min
                                  if batches_per_min else None),
      'max_growth_mb_per_min': settings.max_growth_mb_per_min,
      'passed': bool(slope <= settings.max_growth_mb_per_min),
      'readings': readings, 'malloc': malloc,
  }


def summary(soak: Dict[str, Any]) -> str:
  """A soak's result in three lines: what ran, the slopes, the verdict.

  Args:
    soak: what `run` returned.

  Returns:
    The lines, the last 'PASS: ...' or 'FAIL: ...'.
  """
  s, counts, env = soak['settings'], soak['counts'], soak['env']
  blocks = soak['python_blocks_per_batch']
  return '\n'.join([
      f"soak {'+'.join(s['mode'])} (sampler {s['sampler']}, {s['loop']} "
      f"loop; Python {soak['python']}, TF {soak['tensorflow']}"
      f"{''.join(f', {k}={v}' for k, v in env.items())}): "
      f"{s['duration_s']:.0f} s measured after {s['warmup_s']:.0f} s "
      f"warm-up; {counts['batches']} batches, {counts['steps']} steps "
      f"written, {counts['checkpoints']} checkpoints",
      f"RSS {soak['rss_start_mb']:.1f} -> {soak['rss_end_mb']:.1f} MB "
      f"(peak {soak['rss_peak_mb']:.1f}); slope "
      f"{soak['slope_mb_per_min']:+.2f} MB/min (second half "
      f"{soak['slope_second_half_mb_per_min']:+.2f}); glibc in use "
      f"{soak['malloc_in_use_mb_per_min']:+.2f}, freed-but-kept "
      f"{soak['malloc_free_kept_mb_per_min']:+.2f} MB/min; Python "
      f"blocks {soak['python_blocks_per_min']:+.0f}/min"
      + (f' ({blocks:.1f}/batch)' if blocks is not None else ''),
      f"{'PASS' if soak['passed'] else 'FAIL'}: RSS slope "
      f"{soak['slope_mb_per_min']:+.2f} MB/min, bound "
      f"{s['max_growth_mb_per_min']:g} MB/min"])
