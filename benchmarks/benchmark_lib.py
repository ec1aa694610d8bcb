"""Side-by-side benchmark: smart_replay against the stock TF-Agents Reverb path.

One fixed workload (a TF-Agents `Trajectory` with observation float32[N] or
another shape and dtype, action float32[4], reward, discount and step types;
windows of 2 steps, stride 1) is written and sampled in the same run by every
path, in alternating repeats. The buffers (`workload.BUFFERS`) are 'stock'
(one Reverb column per field, written by TF-Agents), 'ours' (our default
packed layout: one byte column per step), 'ours_columns' (our observer, one
column per field) and 'blocks' (packed items of 32 steps). Measured:

* insert steps/s: `TrajectoryObserver` (single environment, and batched over
  `num_envs` environments) vs TF-Agents' `ReverbAddTrajectoryObserver`;
* sampling transitions/s: `dataset.make_dataset` (what
  `ReplayBufferManager.get_dataset` returns) vs `ReverbReplayBuffer.as_dataset`;
* checkpoint seconds, bytes and restore seconds of the buffers;
* server memory: RSS growth of each buffer's server per million steps, vs the
  raw bytes of the steps;
* optionally (`curve_sizes`), sampling speed and memory per step against the
  buffer's size (`curve`).

Each buffer lives in its own Reverb server process (spawned), so its memory
and its restore time are measured alone. Two reference rows show where the
limits are: `reverb_floor` writes with Reverb's C++ writer calls alone (rows
packed beforehand, a minimal Python loop, no validation or bookkeeping) and
samples with a bare `reverb.TrajectoryDataset` of the packed buffer. Timings
are medians of the repeats; ratios are ours / stock from this one run.

This module runs it all (`run`); the parts are `workload` (the steps and
buffers), `servers` (a server process per buffer), `writers` (insert speed),
`checkpoints` (checkpoint and restore), `sampling` (sampling speed), `curve`
(cost against size) and `report` (ratios, table, charts).
"""

import dataclasses
import importlib.metadata
import json
import os
import platform
import shutil
from typing import Any, Dict, Sequence

import tensorflow as tf

from smart_replay.writing import chunking
from smart_replay_benchmarks import checkpoints as checkpoints_lib
from smart_replay_benchmarks import curve as curve_lib
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


def run(workload: workload_lib.Workload, output_dir: str,
        curve_sizes: Sequence[int] = ()) -> Dict[str, Any]:
  """Runs the benchmark and writes `benchmark.json` and `benchmark.png`.

  Args:
    workload: what to write and sample.
    output_dir: where the results and the (deleted afterwards) server
      checkpoints go; created if missing.
    curve_sizes: buffer sizes (steps) of the size curve, e.g. (100_000,
      1_000_000, 3_000_000); empty for none. With sizes, `curve.png` is
      drawn too.

  Returns:
    The results (also in `output_dir/benchmark.json`): the workload, the
    machine, every measurement, `ratios` {name: {value, target, better,
    met, meaning}} and `curve` (see `curve.measure_curve`).

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
  spec = workload.spec
  per_repeat = workload.steps_per_repeat
  total = per_repeat * workload.repeats
  results: Dict[str, Any] = {
      'workload': dataclasses.asdict(workload),
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version(),
                  'dm_reverb': importlib.metadata.version('dm-reverb'),
                  'tensorflow': tf.__version__,
                  'tf_agents': importlib.metadata.version('tf-agents')},
      'chunk_length': (workload.chunk_length or
                       chunking.auto_chunk_length(
                           workload_lib.BUFFERS['ours'].step_layout(
                               spec).step_spec)),
      'raw_bytes_per_step': workload_lib.raw_bytes_per_step(spec)}
  measured = ('stock', 'ours', 'ours_columns', 'blocks')
  servers = {}
  try:
    for name, buffer in workload_lib.BUFFERS.items():
      servers[name] = servers_lib.ServerProcess(
          spec, 2 * total, os.path.join(work, name), buffer=buffer)
    rss_start = {name: servers[name].rss() for name in measured}
    results['insert_steps_per_s'], replayed = writers.measure_inserts(
        workload, spec, servers)
    results['journal'] = {
        'bytes_per_step': replayed['bytes'] / max(replayed['steps'], 1),
        'replay_steps_per_s': replayed['steps'] / replayed['seconds'],
        'replay_s_per_100k_steps': replayed['seconds'] / max(
            replayed['steps'], 1) * 100_000}
    items = {name: servers[name].items() for name in measured}
    results['memory'] = {
        name: {'rss_growth_bytes': servers[name].rss() - rss_start[name],
               'items': items[name]} for name in measured}
    for name in measured:
      results['memory'][name]['per_million_steps'] = (
          results['memory'][name]['rss_growth_bytes'] / total * 1e6)
    results['memory']['raw_per_million_steps'] = (
        results['raw_bytes_per_step'] * 1e6)
    for name in ('sink', 'ours_columns'):
      servers.pop(name).close()
    checkpoints = checkpoints_lib.measure_checkpoints(
        spec, 2 * total, items, servers, work)
    results['checkpoint'] = {
        name: {k: v for k, v in c.items() if k != 'path'}
        for name, c in checkpoints.items()}
    results['sample_transitions_per_s'] = sampling.measure_sampling(
        workload, spec, 2 * total,
        {name: c['path'] for name, c in checkpoints.items()},
        os.path.join(work, 'sampled'))
    results['curve'] = curve_lib.measure_curve(workload, spec, curve_sizes,
                                               work)
  finally:
    for server in servers.values():
      server.close()
    shutil.rmtree(work, ignore_errors=True)

  results['ratios'] = report.ratios(results)
  with open(os.path.join(output_dir, 'benchmark.json'), 'w') as f:
    json.dump(results, f, indent=2)
  report.plot(results, os.path.join(output_dir, 'benchmark.png'))
  if results['curve']['sizes']:
    report.plot_curve(results, os.path.join(output_dir, 'curve.png'))
  return results
