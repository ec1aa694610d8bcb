"""Probe (issue 16): Reverb's floor with 7 columns vs 1 packed column per step.

The same 2-step items written with the C++ writer calls alone (chunks of 32),
then sampled at batch 256 (the packed rows decoded by `StepCodec.decode`).
Run: .venv/bin/python benchmarks/probe_packed_floor.py (about 1 minute).
Measured 2026-11-23 on 2 cores: insert 31k -> 55k steps/s, sample
77k -> 140k transitions/s.
"""
import time, numpy as np, tree, reverb, tensorflow as tf
from smart_replay import _reverb_internal as ri
from smart_replay.layouts import packed_steps
from smart_replay_benchmarks import workload as wl_lib
spec = wl_lib.data_spec(32)
wl = wl_lib.Workload(steps=60000, repeats=1, episode_length=200)
steps = wl_lib.make_steps(wl, 0, 60000)
flat = [[np.asarray(a) for a in tree.flatten(s)] for s in steps]
codec = packed_steps.StepCodec(spec)
def run(packed):
  sig = (tf.TensorSpec([2, codec.bytes_per_step], tf.uint8) if packed else
         tree.map_structure(lambda s: tf.TensorSpec([2] + s.shape.as_list(), s.dtype), spec))
  table = reverb.Table('t', sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                       max_size=10**6, rate_limiter=reverb.rate_limiters.MinSize(1), signature=sig)
  server = reverb.Server([table]); client = reverb.Client(f'localhost:{server.port}')
  length = 32
  writer = ri.new_trajectory_writer(client, chunk_length=length, keep_alive=length + 2)
  append, create = ri.raw_calls(writer)
  ncol = 1 if packed else len(flat[0]); squeeze = [packed] * 0 + [False] * ncol
  start = time.perf_counter(); previous, items, in_chunk = None, [], 0
  for s, f in zip(steps, flat):
    refs = append([codec.pack(f)] if packed else f)
    in_chunk += 1
    if previous is not None: items.append([[a, b] for a, b in zip(previous, refs)])
    previous = refs
    if in_chunk == length or s.step_type == 2:
      for c in items: create('t', 1.0, c, squeeze)
      items, in_chunk = [], 0
    if s.step_type == 2:
      writer.end_episode(timeout_ms=600000); previous = None
  for c in items: create('t', 1.0, c, squeeze)
  writer.flush(timeout_ms=600000)
  rate = len(steps) / (time.perf_counter() - start)
  writer.close()
  ds = reverb.TrajectoryDataset.from_table_signature(f'localhost:{server.port}', 't', max_in_flight_samples_per_worker=512, num_workers_per_iterator=2).batch(256, drop_remainder=True)
  if packed: ds = ds.map(lambda x: (codec.decode(x.data), x.info))
  ds = ds.prefetch(2); it = iter(ds)
  for _ in range(10): next(it)
  t = time.perf_counter()
  for _ in range(100): next(it)
  smp = 100 * 256 / (time.perf_counter() - t)
  server.stop()
  return rate, smp
for r in range(2):
  for packed in (False, True):
    ins, smp = run(packed)
    print(('packed ' if packed else '7 cols ') + 'insert %.0f steps/s, sample %.0f transitions/s' % (ins, smp), flush=True)
