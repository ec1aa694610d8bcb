"""Memory soak: does RSS stay flat while a buffer is written, sampled and saved?

One real buffer runs in this process (a `ReplayBufferManager` with the
benchmark's step spec, its table filled to capacity first, so a full buffer
should mean flat memory):

* an observer thread writes steps at `--write_steps_per_s`;
* a learner loop takes batches of `manager.get_dataset(batch_size,
  num_steps=2)` as fast as it can, inside a `tf.function` as
  `tf_agents.train.Learner` does (`--loop=eager`: Python `next()`), or of
  TF-Agents' `as_dataset` / a bare `reverb.TrajectoryDataset` (`--sampler`);
* a thread calls `manager.checkpoint()` every `--checkpoint_every_s`.

RSS is read every `--rss_every_s`; after `--warmup_s` a least-squares line is
fitted to it, and the run passes if the slope is at most
`--max_growth_mb_per_min`. Beside RSS it records glibc's counters
(`mallinfo2`: bytes in use vs bytes freed but kept in its arenas) and
Python's allocated blocks, which tell a leak (in-use bytes or Python objects
grow) from allocator retention (free bytes grow, then level off).

Usage:
  MALLOC_ARENA_MAX=2 python scripts/soak.py           # what `make soak` runs
  python scripts/soak.py --mode=sample --sampler=stock --loop=eager
  python scripts/soak.py --duration_s=480 --output_json=soak.json
"""

import ctypes
import json
import os
import shutil
import sys
import tempfile
import threading
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np

FLAGS = flags.FLAGS
flags.DEFINE_float('duration_s', 120.0, 'Seconds measured (after the '
                   'prefill and the warm-up).', lower_bound=1.0)
flags.DEFINE_float('warmup_s', 60.0, 'Seconds run first and left out of the '
                   'fit: thread pools, prefetch buffers and malloc arenas '
                   'fill up during the first checkpoints.', lower_bound=0.0)
flags.DEFINE_list('mode', ['write', 'sample', 'checkpoint'],
                  'What runs: any of write, sample, checkpoint.')
flags.DEFINE_enum('sampler', 'ours', ['ours', 'stock', 'reverb'],
                  'ours: manager.get_dataset; stock: TF-Agents '
                  'ReverbReplayBuffer.as_dataset; reverb: a bare batched '
                  'reverb.TrajectoryDataset.')
flags.DEFINE_enum('loop', 'function', ['function', 'eager'],
                  'function: take batches inside a tf.function (as '
                  'tf_agents.train.Learner does); eager: next(iterator) from '
                  'Python, which leaks ~45 bytes per tensor of every batch '
                  'with TF 2.15 on Python 3.11 (tensorflow#62551).')
flags.DEFINE_integer('batches_per_call', 1, 'Batches per tf.function call '
                     '(--loop=function), like Learner.run(iterations=N).',
                     lower_bound=1)
flags.DEFINE_integer('batch_size', 64, 'Items per batch.', lower_bound=1)
flags.DEFINE_float('write_steps_per_s', 500.0, 'Observer write rate.',
                   lower_bound=1.0)
flags.DEFINE_integer('capacity', 20_000, 'Items the table holds (filled '
                     'before the clock starts).', lower_bound=1)
flags.DEFINE_integer('observation_size', 32, 'Floats per observation.',
                     lower_bound=1)
flags.DEFINE_float('checkpoint_every_s', 20.0, 'Seconds between checkpoints.',
                   lower_bound=0.1)
flags.DEFINE_enum('checkpoint_with', 'manager', ['manager', 'reverb'],
                  'manager: manager.checkpoint(); reverb: the bare Reverb '
                  'Client.checkpoint(), to tell the two apart.')
flags.DEFINE_float('malloc_trim_every_s', 0.0, 'Diagnostic: call glibc '
                   'malloc_trim(0) this often (0: never).', lower_bound=0.0)
flags.DEFINE_float('rss_every_s', 2.0, 'Seconds between RSS readings.',
                   lower_bound=0.1)
flags.DEFINE_float('max_growth_mb_per_min', 5.0, 'Pass bound on the fitted '
                   'RSS slope after the warm-up.')
flags.DEFINE_string('output_json', None, 'Also write the settings, readings '
                    'and result here.')

_LIBC = ctypes.CDLL('libc.so.6')


class _MallInfo2(ctypes.Structure):
  _fields_ = [(name, ctypes.c_size_t) for name in (
      'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks',
      'uordblks', 'fordblks', 'keepcost')]


def rss_mb() -> float:
  """This process's resident set size (VmRSS), MB."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024
  return float('nan')


def malloc_mb():
  """glibc malloc's (in use, freed but kept) MB, or None if it is replaced."""
  if ('malloc' in os.environ.get('LD_PRELOAD', '') or
      not hasattr(_LIBC, 'mallinfo2')):
    return None
  _LIBC.mallinfo2.restype = _MallInfo2
  info = _LIBC.mallinfo2()
  return (info.uordblks + info.hblkhd) / 2**20, info.fordblks / 2**20


def fit_slope(readings, start_s: float) -> float:
  """Least-squares slope, per minute, of the (t, value) at or after start_s."""
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


def run(settings: dict) -> dict:
  """Runs one soak; returns the result (readings included).

  Args:
    settings: the flag values by flag name (see the flags above; `mode` a
      set).
  """
  import reverb  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import smart_replay  # pylint: disable=g-import-not-at-top
  from smart_replay_benchmarks import benchmark_lib as benchmark  # pylint: disable=g-import-not-at-top

  s = settings
  spec = benchmark.data_spec(s['observation_size'])
  steps = benchmark.make_steps(benchmark.Workload(
      steps=1000, repeats=1, observation_size=s['observation_size'],
      num_envs=1), 0, 1000)  # Five 200-step episodes, written round and round.
  work = tempfile.mkdtemp(prefix='soak_')
  manager = smart_replay.ReplayBufferManager(
      spec, capacity=s['capacity'], sequence_length=2,
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
      due = start + counts['steps'] / s['write_steps_per_s']
      time.sleep(max(0.0, due - time.monotonic()))

  def checkpoint():
    client = reverb.Client(manager.server_address)
    while not stop.wait(s['checkpoint_every_s']):
      if s['checkpoint_with'] == 'manager':
        manager.checkpoint()
      else:
        shutil.rmtree(client.checkpoint(), ignore_errors=True)
      counts['checkpoints'] += 1

  per_call = s['batches_per_call'] if s['loop'] == 'function' else 1

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
    for i in range(s['capacity'] + s['capacity'] // 199 + 1):  # A full table.
      observer(steps[i % len(steps)])
    observer.flush()
    if 'write' in s['mode']:
      threads.append(thread(write))
    if 'checkpoint' in s['mode']:
      threads.append(thread(checkpoint))
    for t in threads:
      t.start()
    iterator = None
    if 'sample' in s['mode']:
      iterator = iter(_dataset(manager, s['sampler'], s['batch_size']))
    take = take_in_function if s['loop'] == 'function' else next
    start = time.monotonic()
    total_s = s['warmup_s'] + s['duration_s']
    next_reading = next_log = next_trim = start
    while not stop.is_set():
      now = time.monotonic()
      if now >= next_reading:
        readings.append((now - start, rss_mb()))
        malloc.append((now - start, malloc_mb()))
        blocks.append((now - start, sys.getallocatedblocks()))
        next_reading += s['rss_every_s']
      if now >= next_log:
        print(f'[{now - start:4.0f} s / {total_s:.0f} s, ETA '
              f'{start + total_s - now:3.0f} s] '
              f"{'warm-up' if now - start < s['warmup_s'] else 'measuring'}: "
              f'RSS {readings[-1][1]:.1f} MB, {counts["batches"]} batches, '
              f'{counts["steps"]} steps, {counts["checkpoints"]} checkpoints',
              flush=True)
        next_log += 15
      if s['malloc_trim_every_s'] and now >= next_trim:
        _LIBC.malloc_trim(0)
        next_trim += s['malloc_trim_every_s']
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

  warmup, elapsed = s['warmup_s'], readings[-1][0]
  measured = [r for t, r in readings if t >= warmup]
  slope = fit_slope(readings, warmup)
  batches_per_min = counts['batches'] / elapsed * 60
  blocks_per_min = fit_slope(blocks, warmup)
  return {
      'settings': {k: sorted(v) if isinstance(v, set) else v
                   for k, v in s.items()},
      'env': {k: os.environ[k] for k in ('MALLOC_ARENA_MAX', 'LD_PRELOAD')
              if k in os.environ},
      'python': sys.version.split()[0], 'tensorflow': tf.__version__,
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
      'max_growth_mb_per_min': s['max_growth_mb_per_min'],
      'passed': bool(slope <= s['max_growth_mb_per_min']),
      'readings': readings, 'malloc': malloc,
  }


def main(argv):
  """Runs the soak with the flags, prints the verdict; exits 1 on FAIL.

  Args:
    argv: leftover command-line arguments (none are accepted).
  """
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  modes = set(FLAGS.mode)
  if not modes or not modes <= {'write', 'sample', 'checkpoint'}:
    raise app.UsageError('--mode must be one or more of write, sample, '
                         f'checkpoint; got {FLAGS.mode}')
  logging.set_verbosity(logging.WARNING)
  names = ('duration_s', 'warmup_s', 'sampler', 'loop', 'batches_per_call',
           'batch_size', 'write_steps_per_s', 'capacity', 'observation_size',
           'checkpoint_every_s', 'checkpoint_with', 'malloc_trim_every_s',
           'rss_every_s', 'max_growth_mb_per_min')
  settings = {name: FLAGS[name].value for name in names}
  settings['mode'] = modes
  try:
    result = run(settings)
  except KeyboardInterrupt:  # run() has closed the buffer and removed it.
    print('\nInterrupted: no verdict (the slope needs the whole duration).',
          file=sys.stderr)
    sys.exit(130)

  counts, env = result['counts'], result['env']
  print(f"\nsoak {'+'.join(sorted(modes))} (sampler {FLAGS.sampler}, "
        f"{FLAGS.loop} loop; Python {result['python']}, TF "
        f"{result['tensorflow']}"
        f"{''.join(f', {k}={v}' for k, v in env.items())}): "
        f"{FLAGS.duration_s:.0f} s measured after {FLAGS.warmup_s:.0f} s "
        f"warm-up; {counts['batches']} batches, {counts['steps']} steps "
        f"written, {counts['checkpoints']} checkpoints")
  blocks = result['python_blocks_per_batch']
  print(f"RSS {result['rss_start_mb']:.1f} -> {result['rss_end_mb']:.1f} MB "
        f"(peak {result['rss_peak_mb']:.1f}); slope "
        f"{result['slope_mb_per_min']:+.2f} MB/min (second half "
        f"{result['slope_second_half_mb_per_min']:+.2f}); glibc in use "
        f"{result['malloc_in_use_mb_per_min']:+.2f}, freed-but-kept "
        f"{result['malloc_free_kept_mb_per_min']:+.2f} MB/min; Python "
        f"blocks {result['python_blocks_per_min']:+.0f}/min"
        + (f' ({blocks:.1f}/batch)' if blocks is not None else ''))
  print(f"{'PASS' if result['passed'] else 'FAIL'}: RSS slope "
        f"{result['slope_mb_per_min']:+.2f} MB/min, bound "
        f"{FLAGS.max_growth_mb_per_min:g} MB/min")
  if FLAGS.output_json:
    with open(FLAGS.output_json, 'w') as f:
      json.dump(result, f, indent=1)
  if not result['passed']:
    sys.exit(1)


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
