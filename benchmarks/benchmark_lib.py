"""Side-by-side benchmark: smart_replay against the stock TF-Agents Reverb path.

One fixed workload (a TF-Agents `Trajectory` with observation float32[N],
action float32[4], reward, discount and step types; items of 2 steps, stride
1) is written and sampled in the same run by both paths, alternating repeats:

* insert steps/s: `TrajectoryObserver` (single environment, and batched over
  `num_envs` environments) vs TF-Agents' `ReverbAddTrajectoryObserver`, each
  writing an identical table (`tables.make_table`);
* sampling transitions/s: `dataset.make_dataset` (what
  `ReplayBufferManager.get_dataset` returns) vs `ReverbReplayBuffer.as_dataset`
  on the same table;
* checkpoint seconds, bytes and restore seconds of the two buffers;
* server memory: RSS growth of each buffer's server per million steps, vs the
  raw bytes of the steps.

Each buffer lives in its own Reverb server process (spawned), so its memory
and its restore time are measured alone. Two reference rows show where the
limits are: `reverb_floor` writes with Reverb's C++ writer calls alone (what
our observer does, with a minimal Python loop and no validation or
bookkeeping) and samples with a bare
`reverb.TrajectoryDataset`. Timings are medians of the repeats; ratios are
ours / stock from this one run.
"""

import concurrent.futures
import dataclasses
import importlib.metadata
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import time
from typing import Any, Dict, List, Optional

from absl import logging
import numpy as np
import psutil
import reverb
import tensorflow as tf
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.replay_buffers import reverb_utils
from tf_agents.trajectories import trajectory as trajectory_lib
import tree

from smart_replay import _reverb_internal as reverb_internal
from smart_replay.checkpointing import store as checkpoint_store
from smart_replay.checkpointing import layout as checkpoints_lib
from smart_replay.core import dataset as dataset_lib
from smart_replay.checkpointing import manifest as manifest_lib
from smart_replay.core import observer as observer_lib
from smart_replay.core import local_server as server_lib
from smart_replay.core import tables as tables_lib

TABLE = 'replay'
SEQUENCE_LENGTH = 2
# name: (target, 'higher' or 'lower' is better, what it compares).
TARGETS = {
    'insert': (5.0, 'higher', 'observer steps/s, ours / stock'),
    'batched_insert': (1.5, 'higher',
                       'batched observer steps/s / our single-env steps/s'),
    'sample': (6.0, 'higher', 'transitions/s, get_dataset / as_dataset'),
    'checkpoint_restore_time': (0.5, 'lower',
                                'checkpoint + restore seconds, ours / stock'),
    'checkpoint_bytes': (0.5, 'lower', 'checkpoint bytes, ours / stock'),
    'memory': (1.5, 'lower', 'server RSS growth / raw data bytes (ours)'),
}
_START_TIMEOUT_S = 300.0
_CHECKPOINT_TIMEOUT_S = 1800.0


@dataclasses.dataclass(frozen=True)
class Workload:
  """What the benchmark writes and samples.

  Attributes:
    steps: steps written into each compared buffer (checkpoint and memory are
      measured on buffers of this many steps).
    repeats: alternating repeats; each writes `steps // repeats` steps per path.
    observation_size: floats per observation.
    observation: 'smooth' (sensor-like: slow sines plus noise, rounded to
      0.01) or 'noise' (standard normal floats, which do not compress).
    episode_length: steps per episode.
    num_envs: environments of the batched observer.
    batch_size: sampled items per batch.
    sample_batches: batches timed per sampling repeat.
    chunk_length: our observer's chunk length (None: automatic).
    seed: seed of the generated steps.
  """
  steps: int = 1_000_000
  repeats: int = 5
  observation_size: int = 32
  observation: str = 'smooth'
  episode_length: int = 200
  num_envs: int = 8
  batch_size: int = 256
  sample_batches: int = 200
  chunk_length: Optional[int] = None
  seed: int = 0

  def __post_init__(self):
    for name in ('steps', 'repeats', 'observation_size', 'num_envs',
                 'batch_size', 'sample_batches'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'Workload.{name} must be an integer >= 1, got '
                         f'{value!r}.')
    if self.episode_length < SEQUENCE_LENGTH:
      raise ValueError(f'Workload.episode_length must be >= {SEQUENCE_LENGTH} '
                       f'(the item length), got {self.episode_length!r}.')
    if self.observation not in ('smooth', 'noise'):
      raise ValueError(f"Workload.observation must be 'smooth' or 'noise', got "
                       f'{self.observation!r}.')
    if self.steps // self.repeats < self.num_envs * self.episode_length:
      raise ValueError(
          f'Workload.steps // repeats = {self.steps // self.repeats} steps per '
          f'repeat must cover at least one episode per environment '
          f'(num_envs * episode_length = '
          f'{self.num_envs * self.episode_length}).')

  @property
  def steps_per_repeat(self) -> int:
    """Steps each path writes per repeat."""
    return self.steps // self.repeats


def data_spec(observation_size: int) -> trajectory_lib.Trajectory:
  """The spec of one benchmark step (a TF-Agents `Trajectory`).

  Args:
    observation_size: floats per observation.

  Returns:
    The `Trajectory` of `tf.TensorSpec`s.
  """
  return trajectory_lib.Trajectory(
      step_type=tf.TensorSpec([], tf.int32, 'step_type'),
      observation=tf.TensorSpec([observation_size], tf.float32, 'observation'),
      action=tf.TensorSpec([4], tf.float32, 'action'),
      policy_info=(),
      next_step_type=tf.TensorSpec([], tf.int32, 'next_step_type'),
      reward=tf.TensorSpec([], tf.float32, 'reward'),
      discount=tf.TensorSpec([], tf.float32, 'discount'))


def raw_bytes_per_step(spec: Any) -> int:
  """Bytes of one step's tensors, without any framing.

  Args:
    spec: the step spec.

  Returns:
    The sum of every leaf's size in bytes.
  """
  return sum(s.dtype.size * s.shape.num_elements() for s in tree.flatten(spec))


def make_steps(workload: Workload, start: int, count: int,
               num_envs: Optional[int] = None
               ) -> List[trajectory_lib.Trajectory]:
  """A deterministic stream of steps: the same for the same arguments.

  Args:
    workload: the workload.
    start: index of the first step (episode boundaries follow the index).
    count: steps to make.
    num_envs: None for unbatched steps; else every step holds this many
      environments' steps (outer dimension), each its own stream.

  Returns:
    `count` numpy `Trajectory`s.
  """
  envs = num_envs or 1
  rng = np.random.default_rng([workload.seed, start, envs])
  index = np.arange(start, start + count)[None, :] + (
      np.arange(envs)[:, None] * 7919)  # [envs, count]
  position = index % workload.episode_length
  last = workload.episode_length - 1
  step_type = np.where(position == 0, 0, np.where(position == last, 2, 1))
  next_step_type = np.where(position == last - 1, 2,
                            np.where(position == last, 0, 1))
  shape = (envs, count, workload.observation_size)
  if workload.observation == 'noise':
    observation = rng.standard_normal(shape)
  else:
    phase = np.random.default_rng(workload.seed).uniform(
        0, 2 * np.pi, workload.observation_size)
    observation = np.round(20 + 5 * np.sin(index[..., None] / 50 + phase) +
                           0.05 * rng.standard_normal(shape), 2)
  fields = dict(
      step_type=step_type.astype(np.int32),
      observation=observation.astype(np.float32),
      action=rng.uniform(-1, 1, (envs, count, 4)).astype(np.float32),
      next_step_type=next_step_type.astype(np.int32),
      reward=rng.standard_normal((envs, count)).astype(np.float32),
      discount=np.where(position == last, 0, 1).astype(np.float32))
  if num_envs is None:
    fields = {k: v[0] for k, v in fields.items()}
  else:  # [count, envs, ...]
    fields = {k: np.ascontiguousarray(np.swapaxes(v, 0, 1))
              for k, v in fields.items()}
  return [trajectory_lib.Trajectory(
      policy_info=(), **{k: v[i] for k, v in fields.items()})
          for i in range(count)]


def _table_config(capacity: int) -> tables_lib.TableConfig:
  return tables_lib.TableConfig(name=TABLE).resolve(
      capacity=capacity, sequence_length=SEQUENCE_LENGTH, stride_length=1)


def _serve(connection, spec, capacity, root, fallback) -> None:
  """Runs one Reverb server (in a spawned process) until told to stop."""
  os.environ['TZ'] = 'UTC'  # Checkpoint folder names sort by time.
  time.tzset()
  start = time.perf_counter()
  server = reverb.Server(
      [tables_lib.make_table(_table_config(capacity), spec)],
      checkpointer=reverb.checkpointers.DefaultCheckpointer(
          root, fallback_checkpoint_path=fallback))
  connection.send((server.port, time.perf_counter() - start))
  connection.recv()
  server.stop()


class ServerProcess:
  """A Reverb server with one benchmark table, in its own process.

  Args:
    spec: the step spec.
    capacity: the table's max_size.
    root: the checkpoint root (must not hold a checkpoint).
    fallback: a checkpoint folder to restore, or None.

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
    """The server process's resident memory in bytes."""
    return psutil.Process(self._process.pid).memory_info().rss

  def items(self) -> int:
    """Items in the table."""
    return server_lib.server_info(self.client, 30.0)[TABLE].current_size

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


# ----------------------------------------------------------------- writing

def _write_all(observer, steps) -> float:
  """Calls `observer` on every step, then flushes; returns the seconds."""
  start = time.perf_counter()
  try:
    for step in steps:
      observer(step)
    observer.flush()
    return time.perf_counter() - start
  finally:
    observer.close()


def _write_stock(client: reverb.Client, steps) -> float:
  """Writes `steps` through TF-Agents' `ReverbAddTrajectoryObserver`.

  Its waits have no timeout (that is the stock behaviour); the table never
  blocks inserts here.
  """
  return _write_all(reverb_utils.ReverbAddTrajectoryObserver(
      client, TABLE, sequence_length=SEQUENCE_LENGTH, stride_length=1), steps)


def _write_ours(client: reverb.Client, spec, steps, *, num_envs=None,
                chunk_length=None) -> float:
  """Writes `steps` through our `TrajectoryObserver`; returns seconds."""
  return _write_all(observer_lib.TrajectoryObserver(
      client, tables=[_table_config(1)], data_spec=spec, num_envs=num_envs,
      chunk_length=chunk_length), steps)


def _write_reverb_floor(client: reverb.Client, spec, steps, *,
                        chunk_length=None) -> float:
  """Writes `steps` with Reverb's C++ writer calls alone; returns seconds.

  The same chunks and items as our observer, created the same way (a chunk's
  items once it is complete), from a minimal Python loop with no validation,
  bookkeeping or back-pressure: the speed limit of Reverb's
  `TrajectoryWriter` on this machine.
  """
  length = chunk_length or observer_lib.auto_chunk_length(spec)
  writer = reverb_internal.new_trajectory_writer(
      client, chunk_length=length, keep_alive=length + SEQUENCE_LENGTH)
  append, create_item = reverb_internal.raw_calls(writer)
  squeeze = [False] * len(tree.flatten(spec))
  start = time.perf_counter()
  try:
    previous, items, in_chunk = None, [], 0
    for step in steps:
      refs = append(tree.flatten(step))
      in_chunk += 1
      if previous is not None:
        items.append([[a, b] for a, b in zip(previous, refs)])
      previous = refs
      if in_chunk == length or step.step_type == 2:
        for columns in items:
          create_item(TABLE, 1.0, columns, squeeze)
        items, in_chunk = [], 0
      if step.step_type == 2:
        writer.end_episode(timeout_ms=600_000)
        previous = None
    for columns in items:
      create_item(TABLE, 1.0, columns, squeeze)
    writer.flush(timeout_ms=600_000)
    return time.perf_counter() - start
  finally:
    writer.close()


# ---------------------------------------------------------------- sampling

def _rate(dataset: tf.data.Dataset, batches: int, batch_size: int) -> float:
  """Transitions per second over `batches` batches, after a warm-up."""
  iterator = iter(dataset)
  for _ in range(10):  # Warm up: start the workers, fill the prefetch.
    next(iterator)
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return batches * batch_size / (time.perf_counter() - start)


def _stock_dataset(client: reverb.Client, spec, batch_size: int
                   ) -> tf.data.Dataset:
  """TF-Agents' `ReverbReplayBuffer.as_dataset` on the benchmark table."""
  buffer = reverb_replay_buffer.ReverbReplayBuffer(
      spec, TABLE, sequence_length=SEQUENCE_LENGTH,
      server_address=client.server_address)
  return buffer.as_dataset(sample_batch_size=batch_size,
                           num_steps=SEQUENCE_LENGTH)


def _our_dataset(client: reverb.Client, spec, batch_size: int
                 ) -> tf.data.Dataset:
  """`make_dataset` as `ReplayBufferManager.get_dataset` builds it."""
  return dataset_lib.make_dataset(
      client, table=TABLE, data_spec=spec, sequence_length=SEQUENCE_LENGTH,
      batch_size=batch_size)


def _floor_dataset(client: reverb.Client, spec, batch_size: int
                   ) -> tf.data.Dataset:
  """A bare `reverb.TrajectoryDataset`, batched: Reverb's sampling limit."""
  shapes = tf.nest.map_structure(
      lambda s: tf.TensorShape([SEQUENCE_LENGTH] + s.shape.as_list()), spec)
  dtypes = tf.nest.map_structure(lambda s: s.dtype, spec)
  return reverb.TrajectoryDataset(
      client.server_address, TABLE, dtypes, shapes,
      max_in_flight_samples_per_worker=2 * batch_size,
      num_workers_per_iterator=2,
      rate_limiter_timeout_ms=60_000).batch(batch_size, drop_remainder=True)


# ------------------------------------------------------------- checkpoints

def _folder_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(path, name))
             for name in os.listdir(path))


def _reverb_checkpoint(client: reverb.Client, name: str) -> str:
  """`client.checkpoint()`, bounded by `_CHECKPOINT_TIMEOUT_S`."""
  pool = concurrent.futures.ThreadPoolExecutor(1)
  try:
    return server_lib.wait_for_checkpoint(
        pool.submit(client.checkpoint), timeout_s=_CHECKPOINT_TIMEOUT_S,
        where=f'the {name} buffer\'s server')
  finally:
    pool.shutdown(wait=False)  # A timed-out save must not block here.


def _commit_like_the_manager(reverb_path: str, spec, capacity: int,
                             items: int, root: str) -> str:
  """What `ReplayBufferManager.checkpoint()` adds to Reverb's save.

  Moves the folder to a numbered checkpoint, fingerprints every file and
  writes the manifest.
  """
  config = manifest_lib.build_config(
      data_spec=spec, sequence_length=SEQUENCE_LENGTH, stride_length=1,
      capacity=capacity, table_configs=[_table_config(capacity)])
  counts = {'tables': {TABLE: {'items': items}}, 'env_steps': 0,
            'episodes': 0}
  return checkpoint_store.CheckpointStore(root).commit(
      reverb_path, lambda name, files: manifest_lib.build_manifest(
          config, counts=counts, files=files, checkpoint_name=name))


def _median(values: List[float]) -> float:
  return float(statistics.median(values))


def _measure_inserts(workload: Workload, spec, servers
                     ) -> Dict[str, List[float]]:
  """Steps/s of every writer, one value per repeat, in alternating order."""
  per_repeat = workload.steps_per_repeat
  chunk_length, num_envs = workload.chunk_length, workload.num_envs
  clients = {name: server.client for name, server in servers.items()}
  inserts = {'stock': [], 'ours': [], 'ours_batched': [], 'reverb_floor': []}
  started = time.monotonic()
  for repeat in range(workload.repeats):
    steps = make_steps(workload, repeat * per_repeat, per_repeat)
    batched = make_steps(workload, repeat * per_repeat,
                         per_repeat // num_envs, num_envs)
    # (name, env-steps written, writer); 'sink' takes batched and floor writes.
    jobs = [
        ('stock', len(steps), lambda: _write_stock(clients['stock'], steps)),  # pylint: disable=cell-var-from-loop
        ('ours', len(steps), lambda: _write_ours(  # pylint: disable=cell-var-from-loop
            clients['ours'], spec, steps, chunk_length=chunk_length)),
        ('ours_batched', len(batched) * num_envs, lambda: _write_ours(  # pylint: disable=cell-var-from-loop
            clients['sink'], spec, batched, num_envs=num_envs,
            chunk_length=chunk_length)),
        ('reverb_floor', len(steps), lambda: _write_reverb_floor(  # pylint: disable=cell-var-from-loop
            clients['sink'], spec, steps, chunk_length=chunk_length)),
    ]
    for name, count, write in jobs if repeat % 2 == 0 else jobs[::-1]:
      inserts[name].append(count / write())  # Alternating the order.
    elapsed = time.monotonic() - started
    logging.info(
        'insert repeat %d/%d: stock %.0f, ours %.0f, batched %.0f, reverb '
        'floor %.0f steps/s; ETA %.0f s', repeat + 1, workload.repeats,
        inserts['stock'][-1], inserts['ours'][-1],
        inserts['ours_batched'][-1], inserts['reverb_floor'][-1],
        elapsed / (repeat + 1) * (workload.repeats - repeat - 1))
  return inserts


def _measure_checkpoints(spec, capacity: int, items: Dict[str, int], servers,
                         work: str) -> Dict[str, Dict[str, Any]]:
  """Checkpoints and restores the 'stock' and 'ours' buffers (stops them)."""
  checkpoints = {}
  for name in ('stock', 'ours'):
    start = time.perf_counter()
    path = _reverb_checkpoint(servers[name].client, name)
    if name == 'ours':  # What the manager adds to Reverb's save.
      path = _commit_like_the_manager(path, spec, capacity, items[name],
                                      os.path.join(work, 'ours_buffer'))
    checkpoint = {'path': path, 'seconds': time.perf_counter() - start,
                  'bytes': _folder_bytes(path), 'items': items[name]}
    servers.pop(name).close()
    start = time.perf_counter()
    if name == 'ours':  # The manager verifies every file before loading.
      checkpoints_lib.verify(path)
    verify_seconds = time.perf_counter() - start
    with ServerProcess(spec, capacity, os.path.join(work, f'{name}_restored'),
                       fallback=path) as restored:
      checkpoint['restore_seconds'] = restored.load_seconds + verify_seconds
      checkpoint['restored_items'] = restored.items()
    checkpoints[name] = checkpoint
    logging.info('checkpoint of the %s buffer: %.2f s, %.1f MB, restore '
                 '%.2f s', name, checkpoint['seconds'],
                 checkpoint['bytes'] / 1e6, checkpoint['restore_seconds'])
  return checkpoints


def _measure_sampling(workload: Workload, spec, capacity: int,
                      checkpoint: str, root: str) -> Dict[str, List[float]]:
  """Transitions/s of every pipeline on one restored buffer, 3 repeats.

  Sampling runs where a learner runs: in the process of the server (as with
  ReplayBufferManager), where Reverb hands samples over without serializing
  them.
  """
  server = reverb.Server(
      [tables_lib.make_table(_table_config(capacity), spec)],
      checkpointer=reverb.checkpointers.DefaultCheckpointer(
          root, fallback_checkpoint_path=checkpoint))
  try:
    client = reverb.Client(f'localhost:{server.port}')
    rates = {'stock': [], 'ours': [], 'reverb_floor': []}
    for repeat in range(3):
      for name, make in (('stock', _stock_dataset), ('ours', _our_dataset),
                         ('reverb_floor', _floor_dataset)):
        rates[name].append(_rate(make(client, spec, workload.batch_size),
                                 workload.sample_batches, workload.batch_size))
      logging.info('sampling %s, repeat %d/3: stock %.0f, ours %.0f, reverb '
                   'floor %.0f transitions/s', os.path.basename(root),
                   repeat + 1,
                   rates['stock'][-1], rates['ours'][-1],
                   rates['reverb_floor'][-1])
    return rates
  finally:
    server.stop()


def run(workload: Workload, output_dir: str) -> Dict[str, Any]:
  """Runs the benchmark and writes `benchmark.json` and `benchmark.png`.

  Args:
    workload: what to write and sample.
    output_dir: where the results and the (deleted afterwards) server
      checkpoints go; created if missing.

  Returns:
    The results (also in `output_dir/benchmark.json`): the workload, the
    machine, every measurement, and `ratios` {name: {value, target, better,
    met, meaning}}.

  Raises:
    TimeoutError: if a server process does not start, or a checkpoint takes
      longer than 30 minutes.
  """
  os.makedirs(output_dir, exist_ok=True)
  work = os.path.join(output_dir, 'servers')
  shutil.rmtree(work, ignore_errors=True)
  spec = data_spec(workload.observation_size)
  per_repeat = workload.steps_per_repeat
  total = per_repeat * workload.repeats
  results: Dict[str, Any] = {
      'workload': dataclasses.asdict(workload),
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version(),
                  'dm_reverb': importlib.metadata.version('dm-reverb'),
                  'tensorflow': tf.__version__,
                  'tf_agents': importlib.metadata.version('tf-agents')},
      'chunk_length': (workload.chunk_length or
                       observer_lib.auto_chunk_length(spec)),
      'raw_bytes_per_step': raw_bytes_per_step(spec)}
  servers = {}
  try:
    for name in ('stock', 'ours', 'sink'):  # 'sink': batched and floor writes.
      servers[name] = ServerProcess(spec, 2 * total, os.path.join(work, name))
    rss_start = {name: servers[name].rss() for name in ('stock', 'ours')}
    results['insert_steps_per_s'] = _measure_inserts(workload, spec, servers)
    items = {name: servers[name].items() for name in ('stock', 'ours')}
    results['memory'] = {
        name: {'rss_growth_bytes': servers[name].rss() - rss_start[name],
               'items': items[name]} for name in ('stock', 'ours')}
    for name in ('stock', 'ours'):
      results['memory'][name]['per_million_steps'] = (
          results['memory'][name]['rss_growth_bytes'] / total * 1e6)
    results['memory']['raw_per_million_steps'] = (
        results['raw_bytes_per_step'] * 1e6)
    servers.pop('sink').close()
    checkpoints = _measure_checkpoints(spec, 2 * total, items, servers, work)
    results['checkpoint'] = {
        name: {k: v for k, v in c.items() if k != 'path'}
        for name, c in checkpoints.items()}
    results['sample_transitions_per_s'] = {
        f'{buffer}_buffer': _measure_sampling(
            workload, spec, 2 * total, checkpoints[buffer]['path'],
            os.path.join(work, f'{buffer}_sampled'))
        for buffer in ('ours', 'stock')}
  finally:
    for server in servers.values():
      server.close()
    shutil.rmtree(work, ignore_errors=True)

  results['ratios'] = ratios(results)
  with open(os.path.join(output_dir, 'benchmark.json'), 'w') as f:
    json.dump(results, f, indent=2)
  plot(results, os.path.join(output_dir, 'benchmark.png'))
  return results


def ratios(results: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
  """The target ratios of a run's results.

  Args:
    results: what `run` measured.

  Returns:
    {name: {value, target, better, met, meaning}} for every `TARGETS` entry.
  """
  inserts = {k: _median(v) for k, v in results['insert_steps_per_s'].items()}
  samples = {k: _median(v) for k, v in
             results['sample_transitions_per_s']['ours_buffer'].items()}
  ckpt = results['checkpoint']
  time_s = {k: ckpt[k]['seconds'] + ckpt[k]['restore_seconds'] for k in ckpt}
  memory = results['memory']
  values = {
      'insert': inserts['ours'] / inserts['stock'],
      'batched_insert': inserts['ours_batched'] / inserts['ours'],
      'sample': samples['ours'] / samples['stock'],
      'checkpoint_restore_time': time_s['ours'] / time_s['stock'],
      'checkpoint_bytes': ckpt['ours']['bytes'] / ckpt['stock']['bytes'],
      'memory': (memory['ours']['per_million_steps'] /
                 memory['raw_per_million_steps']),
  }
  out = {}
  for name, value in values.items():
    target, better, meaning = TARGETS[name]
    met = value >= target if better == 'higher' else value <= target
    out[name] = {'value': value, 'target': target, 'better': better,
                 'met': bool(met), 'meaning': meaning}
  return out


def format_table(results: Dict[str, Any]) -> str:
  """The run's medians and ratios as a plain-text table.

  Args:
    results: what `run` returned.

  Returns:
    The table and the list of targets (met or not), one line each.
  """
  rows = [('measure', 'stock', 'ours', 'reverb floor', 'ratio')]
  inserts = {k: _median(v) for k, v in results['insert_steps_per_s'].items()}
  rows.append(('insert steps/s (1 env)', f"{inserts['stock']:,.0f}",
               f"{inserts['ours']:,.0f}", f"{inserts['reverb_floor']:,.0f}",
               f"{inserts['ours'] / inserts['stock']:.2f}x"))
  rows.append((f"insert steps/s ({results['workload']['num_envs']} envs)", '',
               f"{inserts['ours_batched']:,.0f}", '',
               f"{inserts['ours_batched'] / inserts['ours']:.2f}x of 1 env"))
  for buffer, rates in results['sample_transitions_per_s'].items():
    medians = {k: _median(v) for k, v in rates.items()}
    rows.append((f"sample transitions/s ({buffer.replace('_', ' ')})",
                 f"{medians['stock']:,.0f}", f"{medians['ours']:,.0f}",
                 f"{medians['reverb_floor']:,.0f}",
                 f"{medians['ours'] / medians['stock']:.2f}x"))
  ckpt = results['checkpoint']
  for key, label, scale in (('seconds', 'checkpoint s', 1),
                            ('restore_seconds', 'restore s', 1),
                            ('bytes', 'checkpoint MB', 1e-6)):
    rows.append((label, f"{ckpt['stock'][key] * scale:,.2f}",
                 f"{ckpt['ours'][key] * scale:,.2f}", '',
                 f"{ckpt['ours'][key] / ckpt['stock'][key]:.2f}x"))
  memory = results['memory']
  raw = memory['raw_per_million_steps']
  rows.append(('server RSS MB / 1M steps',
               f"{memory['stock']['per_million_steps'] / 1e6:,.0f}",
               f"{memory['ours']['per_million_steps'] / 1e6:,.0f}",
               f'raw {raw / 1e6:,.0f}',
               f"{memory['ours']['per_million_steps'] / raw:.2f}x raw"))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = ['  '.join(cell.ljust(width) for cell, width in zip(row, widths))
           for row in rows]
  lines.append('')
  lines.append('targets:')
  for name, ratio in results['ratios'].items():
    sign = '>=' if ratio['better'] == 'higher' else '<='
    lines.append(f"  {name:24s} {ratio['value']:6.2f}  target {sign} "
                 f"{ratio['target']:g}  {'met' if ratio['met'] else 'NOT met'}"
                 f"  ({ratio['meaning']})")
  return '\n'.join(lines)


def plot(results: Dict[str, Any], path: str) -> None:
  """Draws the ratios against their targets as a PNG bar chart.

  Args:
    results: what `run` measured (with `ratios`).
    path: the PNG file to write.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  names = list(results['ratios'])
  values = [results['ratios'][n]['value'] for n in names]
  colors = ['tab:green' if results['ratios'][n]['met'] else 'tab:red'
            for n in names]
  figure, axes = pyplot.subplots(figsize=(9, 4.5))
  axes.bar(range(len(names)), values, color=colors)
  for i, name in enumerate(names):
    ratio = results['ratios'][name]
    axes.hlines(ratio['target'], i - 0.4, i + 0.4, colors='black',
                linestyles='dashed')
    axes.annotate(f"{ratio['value']:.2f}", (i, ratio['value']),
                  ha='center', va='bottom')
  axes.set_yscale('log')  # Ratios above and below 1 read alike.
  axes.axhline(1.0, color='grey', linewidth=0.8)
  axes.set_xticks(range(len(names)))
  axes.set_xticklabels([n.replace('_', '\n') for n in names])
  axes.set_ylabel('ratio, log scale (dashed: target; green: met)')
  workload = results['workload']
  axes.set_title(
      f"smart_replay vs stock TF-Agents: {workload['steps']:,} steps, "
      f"observation float32[{workload['observation_size']}] "
      f"({workload['observation']}), {results['machine']['cpus']} CPUs")
  figure.tight_layout()
  figure.savefig(path)
  pyplot.close(figure)
