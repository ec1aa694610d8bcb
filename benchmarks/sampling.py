"""Sampling speed: the compared input pipelines on restored buffers.

Each pipeline reads one kind of buffer (`PIPELINES`):

* stock: TF-Agents' `ReverbReplayBuffer.as_dataset` (one column per field);
* ours: `dataset.make_dataset` of the buffer's one table, what
  `ReplayBufferManager.get_dataset` returns, on the packed layout (decoded
  after batching);
* ours_columns: the same on the stock buffer (one column per field);
* reverb_floor: a bare batched `reverb.TrajectoryDataset` of the packed
  buffer, not decoded: Reverb's sampling limit for that layout;
* blocks_w1, blocks_w8: `get_dataset` of packed items, cutting 1 or 8
  windows from each sampled block.
"""

import dataclasses
import time
from typing import Any, Dict, List

from absl import logging
import reverb
import tensorflow as tf
from tf_agents.replay_buffers import reverb_replay_buffer

from smart_replay.sampling import batcher as batcher_lib
from smart_replay.sampling import dataset as dataset_lib
from smart_replay.sampling import replay_info as replay_info_lib
from smart_replay.sampling import sources as sources_lib
from smart_replay_benchmarks import workload as workload_lib

# pipeline: the buffer (`workload.BUFFERS` name) it reads.
PIPELINES = {'stock': 'stock', 'ours': 'ours', 'ours_columns': 'stock',
             'reverb_floor': 'ours', 'blocks_w1': 'blocks',
             'blocks_w8': 'blocks'}


def rate(dataset: tf.data.Dataset, batches: int, batch_size: int) -> float:
  """Transitions per second over `batches` batches, after a warm-up.

  Args:
    dataset: a dataset of batches.
    batches: batches timed.
    batch_size: transitions per batch.

  Returns:
    Transitions per second.
  """
  iterator = iter(dataset)
  for _ in range(10):  # Warm up: start the workers, fill the prefetch.
    next(iterator)
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return batches * batch_size / (time.perf_counter() - start)


def make_pipeline(name: str, client: reverb.Client, spec: Any,
                  batch_size: int) -> tf.data.Dataset:
  """The dataset of pipeline `name` on the server of `client`.

  Args:
    name: a `PIPELINES` name.
    client: a client of a server holding the buffer the pipeline reads.
    spec: the step spec.
    batch_size: items per batch.

  Returns:
    A dataset of batches of `SEQUENCE_LENGTH`-step samples.

  Raises:
    ValueError: if `name` is unknown.
  """
  if name not in PIPELINES:
    raise ValueError(f'unknown pipeline {name!r}; expected one of '
                     f'{sorted(PIPELINES)}.')
  length = workload_lib.SEQUENCE_LENGTH
  buffer = workload_lib.BUFFERS[PIPELINES[name]]
  layout = buffer.step_layout(spec)
  if name == 'stock':
    return reverb_replay_buffer.ReverbReplayBuffer(
        spec, workload_lib.TABLE, sequence_length=length,
        server_address=client.server_address).as_dataset(
            sample_batch_size=batch_size, num_steps=length)
  if name == 'reverb_floor':
    return reverb.TrajectoryDataset(
        client.server_address, workload_lib.TABLE, layout.step_spec.dtype,
        tf.TensorShape([length] + layout.step_spec.shape.as_list()),
        max_in_flight_samples_per_worker=2 * batch_size,
        num_workers_per_iterator=2,
        rate_limiter_timeout_ms=60_000).batch(batch_size, drop_remainder=True)
  config = buffer.table(1)
  if name.startswith('blocks_w'):
    config = dataclasses.replace(
        config, windows_per_item=int(name[len('blocks_w'):]))
  dataset, _ = dataset_lib.make_dataset(
      [sources_lib.Source(client.server_address, config,
                          group=replay_info_lib.ONLINE)],
      plan=batcher_lib.SamplingPlan(batch_size=batch_size),
      output=dataset_lib.Output(layout=layout, betas=[None]))
  return dataset


def measure_sampling(workload: workload_lib.Workload, spec: Any,
                     capacity: int, checkpoints: Dict[str, str], root: str
                     ) -> Dict[str, List[float]]:
  """Transitions/s of every pipeline on the restored buffers, 3 repeats.

  Sampling runs where a learner runs: in the process of the server (as with
  ReplayBufferManager), where Reverb hands samples over without serializing
  them. Every buffer is restored into this process first; each repeat runs
  every pipeline, in alternating order.

  Args:
    workload: the batch size and how many batches each repeat times.
    spec: the step spec.
    capacity: the tables' max_size (windows).
    checkpoints: `{buffer name: checkpoint folder}` of 'stock', 'ours' and
      'blocks'.
    root: a folder for the servers' (empty) checkpoint roots.

  Returns:
    `{pipeline: transitions/s per repeat}` for every `PIPELINES` entry.
  """
  servers = {}
  try:
    for name, path in checkpoints.items():
      servers[name] = workload_lib.make_server(
          spec, capacity, f'{root}/{name}', fallback=path,
          buffer=workload_lib.BUFFERS[name])
    clients = {name: reverb.Client(f'localhost:{server.port}')
               for name, server in servers.items()}
    rates = {name: [] for name in PIPELINES}
    order = list(PIPELINES)
    for repeat in range(3):
      for name in order if repeat % 2 == 0 else order[::-1]:
        rates[name].append(rate(
            make_pipeline(name, clients[PIPELINES[name]], spec,
                          workload.batch_size),
            workload.sample_batches, workload.batch_size))
      logging.info('sampling, repeat %d/3: %s transitions/s', repeat + 1,
                   ', '.join(f'{n} {r[-1]:,.0f}' for n, r in rates.items()))
    return rates
  finally:
    for server in servers.values():
      server.stop()
