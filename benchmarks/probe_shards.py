"""Probe (issue 27): a buffer sharded over 1, 2 and 4 servers on this machine.

Each shard is a `smart-replay-serve` process; one writer process per shard
(a client-mode manager with `actor_id` = the shard) writes float32[32] steps
through the observer; then a learner (this process) samples the sharded
buffer (batch 256, 2 steps) and checkpoints every shard at once. It prints
the aggregate insert rate, each shard's, the sample rate and the
checkpoint time for each number of shards.

Run: .venv/bin/python benchmarks/probe_shards.py [--steps=20000]
(about 3 minutes on 2 cores).
"""

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time

import portpicker

import smart_replay
from smart_replay.server import control_access
from smart_replay.spec import specs
from smart_replay_benchmarks import workload as wl_lib

SPEC_SIZE = 32


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
  port = portpicker.pick_unused_port()
  while not portpicker.is_port_free(port + 1):  # The control service's.
    port = portpicker.pick_unused_port()
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


def measure(num_shards: int, steps: int, root: str) -> dict:
  """Insert, sample and checkpoint figures with `num_shards` shards."""
  spec = wl_lib.data_spec(SPEC_SIZE)
  spec_file = os.path.join(root, 'spec.pbtxt')
  specs.save_spec(spec_file, spec)
  token_file = os.path.join(root, 'control.token')
  if not os.path.exists(token_file):
    control_access.new_token_file(token_file)
  servers = [_serve(root, i, spec_file, token_file)
             for i in range(num_shards)]
  addresses = [address for _, address in servers]
  try:
    context = multiprocessing.get_context('spawn')
    results, ready, go = context.Queue(), context.Queue(), context.Event()
    writers = [context.Process(target=_write,
                               args=(addresses, token_file, i, steps, ready,
                                     go, results))
               for i in range(num_shards)]
    for writer in writers:
      writer.start()
    for _ in writers:  # Every writer connected: they start together.
      ready.get(timeout=600)
    began = time.time()
    go.set()
    reports = [results.get(timeout=600) for _ in writers]
    rates = {shard: rate for shard, rate, _ in reports}
    wall = max(ended for _, _, ended in reports) - began
    for writer in writers:
      writer.join(60)
    manager = smart_replay.ReplayBufferManager(
        spec, server_address=addresses, control_token_file=token_file)
    manager.connect()
    batches = iter(manager.get_dataset(batch_size=256, num_steps=2))
    for _ in range(5):
      next(batches)
    began, count = time.perf_counter(), 0
    while time.perf_counter() - began < 5:
      next(batches)
      count += 256
    sample_rate = count / (time.perf_counter() - began)
    began = time.perf_counter()
    manager.checkpoint()
    checkpoint_s = time.perf_counter() - began
    items = manager.num_frames()
    manager.close()
  finally:
    for process, _ in servers:
      process.send_signal(signal.SIGKILL)
      process.wait(60)
  return {'shards': num_shards, 'steps_per_writer': steps,
          'insert_steps_per_s_total': num_shards * steps / wall,
          'insert_steps_per_s_per_shard': [round(rates[i]) for i in
                                           range(num_shards)],
          'sample_elements_per_s': sample_rate, 'checkpoint_s': checkpoint_s,
          'items': items}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--steps', type=int, default=20000)
  parser.add_argument('--shards', default='1,2,4')
  args = parser.parse_args()
  for num_shards in map(int, args.shards.split(',')):
    with tempfile.TemporaryDirectory() as root:
      print(json.dumps(measure(num_shards, args.steps, root)), flush=True)


if __name__ == '__main__':
  main()
