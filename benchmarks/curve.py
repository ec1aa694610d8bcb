"""Cost against buffer size: sampling speed and server memory per step.

One server process per buffer ('stock', 'ours' packed, 'blocks' of packed
items) grows through the sizes asked for (e.g. 100k, 1M, 3M steps); at each
size the server's RSS growth per step is read and each buffer is sampled in
its own process (as a learner beside its server would), so growth with size
is visible. A size that would not fit in the machine's free memory (judged
from the growth so far) is skipped, with the reason logged and recorded.
"""

import os
import time
from typing import Any, Dict, List, Sequence

from absl import logging

from smart_replay_benchmarks import extras
from smart_replay_benchmarks import servers as servers_lib
from smart_replay_benchmarks import workload as workload_lib
from smart_replay_benchmarks import writers

# buffer: the pipeline sampling it.
CURVE_PIPELINES = {'stock': 'stock', 'ours': 'ours', 'blocks': 'blocks_w1'}
_WRITE_CHUNK = 50_000  # Steps generated and written at a time.


def _write(workload: workload_lib.Workload, spec: Any,
           servers: Dict[str, servers_lib.ServerProcess], start: int,
           stop: int, began: float, total: int) -> None:
  """Writes steps `start..stop` into every buffer, logging rate and ETA."""
  for first in range(start, stop, _WRITE_CHUNK):
    steps = workload_lib.make_steps(workload, first,
                                    min(_WRITE_CHUNK, stop - first))
    for name, server in servers.items():
      if name == 'stock':
        writers.write_stock(server.client, steps)
      else:
        writers.write_ours(server.client, spec, steps, buffer=server.buffer,
                           chunk_length=workload.chunk_length)
    done = first + len(steps)
    elapsed = time.monotonic() - began
    logging.info('curve: %d/%d steps written into each buffer, %.0f steps/s '
                 '(all buffers), ETA %.0f s', done, total,
                 done / elapsed, elapsed / done * (total - done))


def measure_curve(workload: workload_lib.Workload, spec: Any,
                  sizes: Sequence[int], work: str) -> Dict[str, Any]:
  """Sampling transitions/s and server bytes per step at each buffer size.

  Args:
    workload: the steps (its observation, episodes, batch size and sampled
      batches).
    spec: the step spec.
    sizes: buffer sizes in steps, e.g. (100_000, 1_000_000, 3_000_000).
    work: a folder for the servers' checkpoint roots.

  Returns:
    `{'sizes': [...], 'sample': {buffer: [transitions/s]},
    'bytes_per_step': {buffer: [RSS growth / steps]}, 'skipped': [{'size',
    'reason'}]}`, lists in the order of `sizes` measured.

  Raises:
    ImportError: if psutil (the `bench` extra) is not installed.
  """
  psutil = extras.require('psutil')
  sizes = sorted(set(sizes))
  result = {'sizes': [], 'sample': {b: [] for b in CURVE_PIPELINES},
            'bytes_per_step': {b: [] for b in CURVE_PIPELINES}, 'skipped': []}
  if not sizes:
    return result
  servers = {}
  try:
    for name in CURVE_PIPELINES:
      servers[name] = servers_lib.ServerProcess(
          spec, max(sizes), os.path.join(work, f'curve_{name}'),
          buffer=workload_lib.BUFFERS[name])
    start_rss = {name: server.rss() for name, server in servers.items()}
    written, began = 0, time.monotonic()
    for size in sizes:
      if written:
        growth = sum(s.rss() - start_rss[n] for n, s in servers.items())
        needed = growth / written * (size - written)
        free = psutil.virtual_memory().available
        if needed > 0.9 * free:
          reason = (f'{size:,} steps would need about {needed / 1e9:.1f} GB '
                    f'more server memory; {free / 1e9:.1f} GB is free')
          logging.warning('curve: skipping %s', reason)
          result['skipped'] += [{'size': s, 'reason': reason}
                                for s in sizes[sizes.index(size):]]
          break
      _write(workload, spec, servers, written, size, began, sizes[-1])
      written = size
      result['sizes'].append(size)
      for name, server in servers.items():
        result['bytes_per_step'][name].append(
            (server.rss() - start_rss[name]) / size)
        result['sample'][name].append(server.sample(
            CURVE_PIPELINES[name], workload.batch_size,
            workload.sample_batches))
      logging.info('curve at %d steps: %s', size, ', '.join(
          f"{n} {result['sample'][n][-1]:,.0f} transitions/s, "
          f"{result['bytes_per_step'][n][-1]:,.0f} B/step"
          for n in CURVE_PIPELINES))
  finally:
    for server in servers.values():
      server.close()
  return result


def sizes_flag(text: str) -> List[int]:
  """Parses '100000,1000000' (or '' for none) into sizes in steps.

  Args:
    text: comma-separated positive integers.

  Returns:
    The sizes.

  Raises:
    ValueError: naming the entry that is not a positive integer.
  """
  sizes = []
  for entry in filter(None, (e.strip() for e in text.split(','))):
    if not entry.replace('_', '').isdigit() or int(entry) < 1:
      raise ValueError(f'curve size {entry!r} is not a positive integer of '
                       'steps.')
    sizes.append(int(entry))
  return sizes
