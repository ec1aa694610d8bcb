"""Sampling speed: the compared input pipelines on one restored buffer.

* stock: TF-Agents' `ReverbReplayBuffer.as_dataset`;
* ours: `dataset.make_dataset`, what `ReplayBufferManager.get_dataset`
  returns;
* reverb_floor: a bare batched `reverb.TrajectoryDataset`.
"""

import os
import time
from typing import Any, Dict, List

from absl import logging
import reverb
import tensorflow as tf
from tf_agents.replay_buffers import reverb_replay_buffer

from smart_replay.core import dataset as dataset_lib
from smart_replay_benchmarks import servers as servers_lib
from smart_replay_benchmarks import workload as workload_lib


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
      spec, workload_lib.TABLE, sequence_length=workload_lib.SEQUENCE_LENGTH,
      server_address=client.server_address)
  return buffer.as_dataset(sample_batch_size=batch_size,
                           num_steps=workload_lib.SEQUENCE_LENGTH)


def _our_dataset(client: reverb.Client, spec, batch_size: int
                 ) -> tf.data.Dataset:
  """`make_dataset` as `ReplayBufferManager.get_dataset` builds it."""
  return dataset_lib.make_dataset(
      client, table=workload_lib.TABLE, data_spec=spec,
      sequence_length=workload_lib.SEQUENCE_LENGTH, batch_size=batch_size)


def _floor_dataset(client: reverb.Client, spec, batch_size: int
                   ) -> tf.data.Dataset:
  """A bare `reverb.TrajectoryDataset`, batched: Reverb's sampling limit."""
  length = workload_lib.SEQUENCE_LENGTH
  shapes = tf.nest.map_structure(
      lambda s: tf.TensorShape([length] + s.shape.as_list()), spec)
  dtypes = tf.nest.map_structure(lambda s: s.dtype, spec)
  return reverb.TrajectoryDataset(
      client.server_address, workload_lib.TABLE, dtypes, shapes,
      max_in_flight_samples_per_worker=2 * batch_size,
      num_workers_per_iterator=2,
      rate_limiter_timeout_ms=60_000).batch(batch_size, drop_remainder=True)


def measure_sampling(workload: workload_lib.Workload, spec: Any,
                     capacity: int, checkpoint: str, root: str
                     ) -> Dict[str, List[float]]:
  """Transitions/s of every pipeline on one restored buffer, 3 repeats.

  Sampling runs where a learner runs: in the process of the server (as with
  ReplayBufferManager), where Reverb hands samples over without serializing
  them.

  Args:
    workload: the batch size and how many batches each repeat times.
    spec: the step spec.
    capacity: the table's max_size.
    checkpoint: the checkpoint folder the server restores.
    root: the server's (empty) checkpoint root.

  Returns:
    {'stock', 'ours', 'reverb_floor': transitions/s per repeat}.
  """
  server = servers_lib.make_server(spec, capacity, root, fallback=checkpoint)
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
