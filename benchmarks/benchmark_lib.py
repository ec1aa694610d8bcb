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

This module runs it all (`run`); the parts are `workload` (the steps),
`servers` (a server process per buffer), `writers` (insert speed),
`checkpoints` (checkpoint and restore), `sampling` (sampling speed) and
`report` (ratios, table, chart).
"""

import dataclasses
import importlib.metadata
import json
import os
import platform
import shutil
from typing import Any, Dict

import tensorflow as tf

from smart_replay.core import observer as observer_lib
from smart_replay_benchmarks import checkpoints as checkpoints_lib
from smart_replay_benchmarks import extras
from smart_replay_benchmarks import report
from smart_replay_benchmarks import sampling
from smart_replay_benchmarks import servers as servers_lib
from smart_replay_benchmarks import workload as workload_lib
from smart_replay_benchmarks import writers

# The benchmark's public names, whichever module holds them.
SEQUENCE_LENGTH = workload_lib.SEQUENCE_LENGTH
TABLE = workload_lib.TABLE
TARGETS = report.TARGETS
Workload = workload_lib.Workload
data_spec = workload_lib.data_spec
format_table = report.format_table
make_steps = workload_lib.make_steps
plot = report.plot
ratios = report.ratios
raw_bytes_per_step = workload_lib.raw_bytes_per_step


def run(workload: workload_lib.Workload, output_dir: str) -> Dict[str, Any]:
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
    ImportError: if psutil or matplotlib (the `bench` extra) is missing;
      checked before anything runs.
  """
  extras.check_installed('psutil', 'matplotlib')
  os.makedirs(output_dir, exist_ok=True)
  work = os.path.join(output_dir, 'servers')
  shutil.rmtree(work, ignore_errors=True)
  spec = workload_lib.data_spec(workload.observation_size)
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
      'raw_bytes_per_step': workload_lib.raw_bytes_per_step(spec)}
  servers = {}
  try:
    for name in ('stock', 'ours', 'sink'):  # 'sink': batched and floor writes.
      servers[name] = servers_lib.ServerProcess(
          spec, 2 * total, os.path.join(work, name))
    rss_start = {name: servers[name].rss() for name in ('stock', 'ours')}
    results['insert_steps_per_s'] = writers.measure_inserts(
        workload, spec, servers)
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
    checkpoints = checkpoints_lib.measure_checkpoints(
        spec, 2 * total, items, servers, work)
    results['checkpoint'] = {
        name: {k: v for k, v in c.items() if k != 'path'}
        for name, c in checkpoints.items()}
    results['sample_transitions_per_s'] = {
        f'{buffer}_buffer': sampling.measure_sampling(
            workload, spec, 2 * total, checkpoints[buffer]['path'],
            os.path.join(work, f'{buffer}_sampled'))
        for buffer in ('ours', 'stock')}
  finally:
    for server in servers.values():
      server.close()
    shutil.rmtree(work, ignore_errors=True)

  results['ratios'] = report.ratios(results)
  with open(os.path.join(output_dir, 'benchmark.json'), 'w') as f:
    json.dump(results, f, indent=2)
  report.plot(results, os.path.join(output_dir, 'benchmark.png'))
  return results
