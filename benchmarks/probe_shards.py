"""Probe: a buffer sharded over 1, 2 and 4 servers, and a starter mixed in.

Each shard is a `smart-replay-serve` process; one writer process per shard
(a client-mode manager with `actor_id` = the shard) writes float32[32] steps
through the observer. Then a learner (this process) samples every buffer
(batch 256, 2 steps) in alternating rounds, so that the machine's noise
falls on each alike: one server's plain dataset, the 2-shard and the 4-shard
buffer. Last, in this process, a local buffer's plain dataset and the same
buffer with a starter mixed in (`starter_fraction=0.5`), alternating too.
It prints one JSON line per buffer (insert rate, each shard's, the median
sample rate and its median ratio to plain's in the same round, the
checkpoint time) and one with the ratios.

Run: .venv/bin/python benchmarks/probe_shards.py [--steps=20000]
(about 4 minutes on 2 cores).
"""

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import smart_replay
from smart_replay.control import access as control_access
from smart_replay.utils import ports
from smart_replay_benchmarks import workload as wl_lib

SPEC_SIZE = 32
BATCH = 256


def _write(addresses, token_file, shard, steps, ready, go, results):
  """A writer process: connects, waits for `go`, writes `steps` steps into
  shard `shard`; reports its rate and when it finished."""
  spec = wl_lib.data_spec(SPEC_SIZE)
  stream = wl_lib.make_steps(wl_lib.Workload(steps=steps, repeats=1),
                             shard * steps, steps)
  manager = smart_replay.ReplayBufferManager(
      spec, server_address=list(addresses), actor_id=shard,
      control_token_file=token_file)
  _, observer = manager.connect()
  ready.put(shard)
  go.wait(600)
  began = time.time()
  for step in stream:
    observer(step)
  observer.flush()
  ended = time.time()
  results.put((shard, steps / (ended - began), ended))
  manager.close()


def _serve(root, index, spec_file, token_file):
  port = ports.free_port_pair()  # P + 1: the control service's.
  process = subprocess.Popen(
      [sys.executable, '-m', 'smart_replay_scripts.serve',
       f'--spec_file={spec_file}', f'--checkpoint_dir={root}/shard{index}',
       f'--port={port}', '--capacity=1000000',
       f'--control_token_file={token_file}'],
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  line = process.stdout.readline()
  if not line.startswith('Serving'):
    raise RuntimeError(f'shard {index} did not start: {line!r}')
  return process, f'localhost:{port}'


def _fill(addresses, token_file, steps):
  """Writes `steps` steps into each shard at once; returns the total and
  each shard's insert rate."""
  context = multiprocessing.get_context('spawn')
  results, ready, go = context.Queue(), context.Queue(), context.Event()
  writers = [context.Process(target=_write,
                             args=(addresses, token_file, i, steps, ready,
                                   go, results))
             for i in range(len(addresses))]
  for writer in writers:
    writer.start()
  for _ in writers:  # Every writer connected: they start together.
    ready.get(timeout=600)
  began = time.time()
  go.set()
  reports = [results.get(timeout=600) for _ in writers]
  wall = max(ended for _, _, ended in reports) - began
  for writer in writers:
    writer.join(60)
  rates = {shard: rate for shard, rate, _ in reports}
  return (len(addresses) * steps / wall,
          [round(rates[i]) for i in range(len(addresses))])


def _rate(iterator, seconds):
  """Windows per second drawn from `iterator` for `seconds`."""
  for _ in range(3):
    next(iterator)
  began, count = time.perf_counter(), 0
  while time.perf_counter() - began < seconds:
    next(iterator)
    count += BATCH
  return count / (time.perf_counter() - began)


def _alternate(iterators, rounds, seconds):
  """Each iterator's rates, measured in turn, `rounds` times (the order
  turns each round, so that none is always measured first)."""
  rates = {name: [] for name in iterators}
  names = list(iterators)
  for index in range(rounds):
    turn = index % len(names)
    for name in names[turn:] + names[:turn]:
      rates[name].append(_rate(iterators[name], seconds))
  return rates


def _ratio(rates, name, reference):
  """The median over rounds of `name`'s rate over `reference`'s in the same
  round: measured minutes apart, two rates would share less of the
  machine's drift."""
  return round(statistics.median(
      a / b for a, b in zip(rates[name], rates[reference])), 3)


def sharded(steps, root, rounds, seconds):
  """Insert, sample and checkpoint figures of 1, 2 and 4 shards."""
  spec = wl_lib.data_spec(SPEC_SIZE)
  spec_file = os.path.join(root, 'spec.pbtxt')
  smart_replay.save_spec(spec_file, spec)
  token_file = os.path.join(root, 'control.token')
  control_access.new_token_file(token_file)
  servers, groups = [], {}
  try:
    for count in (1, 2, 4):
      made = [_serve(os.path.join(root, f'x{count}'), i, spec_file,
                     token_file) for i in range(count)]
      servers += made
      groups[count] = [address for _, address in made]
    figures, managers, iterators = {}, {}, {}
    for count, addresses in groups.items():
      total, per_shard = _fill(addresses, token_file, steps)
      figures[count] = {'shards': count, 'steps_per_writer': steps,
                        'insert_steps_per_s_total': round(total),
                        'insert_steps_per_s_per_shard': per_shard}
      manager = smart_replay.ReplayBufferManager(
          spec, server_address=addresses if count > 1 else addresses[0],
          control_token_file=token_file)
      manager.connect()
      managers[count] = manager
      iterators[count] = iter(manager.get_dataset(batch_size=BATCH,
                                                  num_steps=2))
    rates = _alternate(iterators, rounds, seconds)
    for count, manager in managers.items():
      began = time.perf_counter()
      manager.checkpoint()
      figures[count].update(
          sample_windows_per_s=round(statistics.median(rates[count])),
          sample_to_plain=_ratio(rates, count, 1),
          sample_rounds=[round(r) for r in rates[count]],
          checkpoint_s=round(time.perf_counter() - began, 2),
          items=manager.num_frames())
      manager.close()
    return figures
  finally:
    for process, _ in servers:
      process.send_signal(signal.SIGKILL)
      process.wait(60)


def starter_mix(steps, root, rounds, seconds):
  """A local buffer's plain dataset and the same buffer with a starter of
  as many steps mixed into every batch (half and half)."""
  spec = wl_lib.data_spec(SPEC_SIZE)
  stream = wl_lib.make_steps(wl_lib.Workload(steps=2 * steps, repeats=1), 0,
                             2 * steps)
  starter_dir = os.path.join(root, 'starter')
  with smart_replay.ReplayBufferManager(
      spec, capacity=10 * steps, checkpoint_dir=starter_dir) as starter:
    _, observer = starter.create_replay_buffer()
    for step in stream[:steps]:
      observer(step)
    starter.checkpoint()
  with smart_replay.ReplayBufferManager(
      spec, capacity=10 * steps, checkpoint_dir=os.path.join(root, 'run'),
      starter_dir=starter_dir) as manager:
    _, observer = manager.create_replay_buffer()
    for step in stream[steps:]:
      observer(step)
    manager.flush()
    iterators = {
        'plain': iter(manager.get_dataset(batch_size=BATCH, num_steps=2)),
        'starter_mix': iter(manager.get_dataset(
            batch_size=BATCH, num_steps=2, starter_fraction=0.5))}
    rates = _alternate(iterators, rounds, seconds)
  return {name: {'sample_windows_per_s': round(statistics.median(r)),
                 'sample_to_plain': _ratio(rates, name, 'plain'),
                 'sample_rounds': [round(x) for x in r]}
          for name, r in rates.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--steps', type=int, default=20000)
  parser.add_argument('--rounds', type=int, default=9,
                      help='alternating sample measurements of each buffer')
  parser.add_argument('--seconds', type=float, default=3.0,
                      help='length of one sample measurement')
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as root:
    figures = sharded(args.steps, root, args.rounds, args.seconds)
    mix = starter_mix(args.steps, root, args.rounds, args.seconds)
  for count in sorted(figures):
    print(json.dumps(figures[count]), flush=True)
  for name, figure in mix.items():
    print(json.dumps({'local': name, **figure}), flush=True)
  print(json.dumps({
      'sample_to_plain': {f'{count}_shards': figures[count]['sample_to_plain']
                          for count in (2, 4)},
      'starter_mix_to_local_plain': mix['starter_mix']['sample_to_plain']}),
        flush=True)


if __name__ == '__main__':
  main()
