"""Both layouts store the same items: the same stream, the same windows."""

import collections

import numpy as np
import pytest
import reverb
import tensorflow as tf
from tf_agents.environments import batched_py_environment
from tf_agents.policies import random_py_policy

import smart_replay
from smart_replay import layouts
from smart_replay.config import reverb_tables
from smart_replay.config import tables
from smart_replay.sampling import batcher
from smart_replay.sampling import dataset as dataset_lib
from smart_replay.sampling import sources
from smart_replay.layouts import packed_steps
from smart_replay.layouts import protocol
from smart_replay.layouts.frame_cells import FrameStack
from smart_replay.writing import observer as observer_lib
from tests import testing


def _tables():
  drain = dict(sampler='fifo', max_times_sampled=1)  # Each item once.
  return [c.resolve(capacity=10_000, sequence_length=3, stride_length=1)
          for c in (tables.TableConfig(name='windows', **drain),
                    tables.TableConfig(name='strided', stride_length=2,
                                       **drain),
                    tables.TableConfig(name='episodes', kind='episode',
                                       episode_length=12, **drain))]


def _windows(layout_name, data_spec, steps, num_envs=None):
  """{table: Counter of item fingerprints} written through `layout_name`."""
  layout = packed_steps.Layout(layout_name, data_spec)
  configs = _tables()
  server = reverb.Server([reverb_tables.make_table(c, layout.step_spec)
                          for c in configs])
  client = reverb.Client(f'localhost:{server.port}')
  try:
    observer = observer_lib.TrajectoryObserver(
        client, tables=configs, data_spec=data_spec, layout=layout,
        num_envs=num_envs,
        timeouts=smart_replay.Timeouts(write_timeout_s=10.0))
    if num_envs:
      env = batched_py_environment.BatchedPyEnvironment(
          [testing.make_env(seed=3 + i) for i in range(num_envs)])
      policy = random_py_policy.RandomPyPolicy(
          env.envs[0].time_step_spec(), env.envs[0].action_spec(),
          info_spec=testing.INFO_SPEC, outer_dims=(num_envs,), seed=3)
      testing.run_actor(observer, steps, env=env, policy=policy)
    else:
      testing.run_actor(observer, steps, seed=3)
    observer.close()
    found = {}
    for config in configs:
      dataset, _ = dataset_lib.make_dataset(
          [sources.Source(client.server_address, config, group=0)],
          plan=batcher.SamplingPlan(batch_size=1, timeout_s=1.0),
          output=dataset_lib.Output(layout=layout, betas=[None]))
      seen = collections.Counter()
      for (trajectory, info) in _until_timeout(dataset):
        mask = info.mask.numpy()[0]
        seen[testing.item_fingerprint(tf.nest.map_structure(
            lambda t: t.numpy()[0][mask], trajectory))] += 1
      found[config.name] = seen
    return found
  finally:
    server.stop()


def _until_timeout(dataset):
  iterator = iter(dataset)
  while True:
    try:
      yield next(iterator)
    except tf.errors.OpError:  # Drained: the sampling timeout fired.
      return


@pytest.mark.parametrize('num_envs', [None, 2])
def test_packed_layout_stores_the_same_windows(data_spec, num_envs):
  columns = _windows('columns', data_spec, 60, num_envs)
  packed = _windows('packed', data_spec, 60, num_envs)
  for name in columns:
    assert sum(columns[name].values()) > 5, name
  assert packed == columns


def test_packed_signature_is_one_byte_column(data_spec):
  layout = packed_steps.Layout('packed', data_spec)
  config = _tables()[0]
  signature = reverb_tables.signature(config, layout.step_spec)
  assert signature.dtype == tf.uint8
  assert signature.shape == [3, packed_steps.StepCodec(data_spec).bytes_per_step]
  assert layout.num_columns == 1
  batch = [np.zeros((5,) + tuple(s.shape), s.dtype.as_numpy_dtype)
           for s in tf.nest.flatten(data_spec)]
  (column,) = layout.columns(batch)
  assert column.shape == (5, layout.step_spec.shape[0])


def _every_layout(data_spec):
  """{name: layout} of each format, with writer ids where they exist."""
  frames = testing.frame_spec([3, 6, 5])
  return {
      'columns': packed_steps.Layout('columns', data_spec),
      'packed': packed_steps.Layout('packed', data_spec, ids=True),
      'frames': layouts.make_layout(
          'packed', frames, FrameStack('observation', 0, codec='zlib'),
          writer_ids=True)}


def test_every_layout_supplies_the_whole_protocol(data_spec):
  for name, layout in _every_layout(data_spec).items():
    assert isinstance(layout, protocol.StepLayout), name


def test_each_layout_round_trips_a_step_through_its_encoder(data_spec):
  """What a stream appends (`encoder`) and a checkpoint reader gets back
  (`stored_fields`) is the step, whatever the format."""
  for name, layout in _every_layout(data_spec).items():
    spec = layout.data_spec
    step = [np.full(s.shape, 1 + i, s.dtype.as_numpy_dtype)
            for i, s in enumerate(tf.nest.flatten(spec))]
    columns = layout.columns(step)
    if layout.writer_ids:
      layout.stamp_ids(columns, 7, 9)
    encoder = layout.encoder()
    first = encoder.cells(columns, first=True)
    assert len(first) == 1 + layout.lookback, name  # Empty cells first.
    assert len(encoder.cells(columns, first=False)) == 1, name
    encoder.reset()
    assert len(encoder.cells(columns, first=True)) == 1 + layout.lookback
    stored = [np.stack([cell[i] for cell in first])
              for i in range(layout.num_columns)]
    fields = layout.stored_fields(stored)
    for got, want in zip(fields, step):
      np.testing.assert_array_equal(got[-1], want, err_msg=name)
    if layout.writer_ids:
      ids = layout.read_ids(stored[0], block=False)
      assert [int(i[-1]) for i in ids] == [7, 0, 9], name


def test_blocks_of_each_packed_layout_hold_their_rows(data_spec):
  for name, layout in _every_layout(data_spec).items():
    if name == 'columns':  # No blocks (`BufferConfig` refuses them).
      assert layout.block_step_bytes is None
      continue
    step = [np.full(s.shape, 2, s.dtype.as_numpy_dtype)
            for s in tf.nest.flatten(layout.data_spec)]
    rows = layout.block_rows(layout.columns(step))
    assert rows.dtype == np.uint8, name
    assert rows.shape == (layout.block_step_bytes,), name
    block = np.stack([rows, np.zeros_like(rows)])
    column = layout.block_column(block, 1)
    fields = layout.stored_fields([np.asarray(column)[None]])
    for got, want in zip(fields, step):
      np.testing.assert_array_equal(got[0][0], want, err_msg=name)
