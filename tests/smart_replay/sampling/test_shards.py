"""A buffer sharded over three Reverb servers samples as one big table would.

Three managers (three real servers) hold 42, 84 and 126 items; the sharded
dataset must sample every item with probability 1/252 (uniform tables) or
p_i / sum(p) (prioritized), with importance weights over the whole buffer.
Each chi-square test also checks that its statistic rejects the wrong mix
(shards drawn equally, or by size where priorities should count), so a
passing test is not vacuous.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

from smart_replay import layouts
from smart_replay.config import mixable
from smart_replay.config import tables
from smart_replay.manager import facade as manager_lib
from smart_replay.sampling import batcher
from smart_replay.sampling import dataset as dataset_lib
from smart_replay.sampling import sources as sources_lib
from tests.smart_replay.sampling import test_sampling_distribution as dist

REPEATS = (1, 2, 3)  # Each shard holds the 42 windows of LENGTHS this often.
ITEMS = [42 * r for r in REPEATS]


@pytest.fixture
def sharded(tmp_path):
  """`make(config, priorities=None)`: three managers filled as `REPEATS`."""
  managers = []

  def make(config, priorities=None):
    for index, repeats in enumerate(REPEATS):
      manager = manager_lib.ReplayBufferManager(
          dist._spec(), capacity=1000, layout='columns',  # pylint: disable=protected-access
          checkpoint_dir=str(tmp_path / f'shard{index}'),
          table_configs=[config])
      manager.create_replay_buffer()
      observer = manager.make_observer(
          priority=priorities[index] if priorities else None)
      for _ in range(repeats):
        dist._write(observer)  # pylint: disable=protected-access
      managers.append(manager)
    return managers

  yield make
  for manager in managers:
    manager.close()


def _dataset(managers, beta=None):
  """The one batcher over the managers' tables as the shards of a buffer."""
  sources = [sources_lib.Source(m.server_address, m.table_configs[0],
                                group=0, shard=k, size=m.num_frames(),
                                watched=True)
             for k, m in enumerate(managers)]
  dataset, _ = dataset_lib.make_dataset(
      sources, plan=batcher.SamplingPlan(batch_size=dist.BATCH, timeout_s=10),
      output=dataset_lib.Output(
          layout=layouts.make_layout('columns', dist._spec()),  # pylint: disable=protected-access
          betas=[beta]))
  return dataset


def _count(dataset, warm_up=4):
  """{(shard, key): times sampled} over `SAMPLES` elements after `warm_up`
  batches (each shard's mass is exact once it has been sampled), and the
  last batch's ReplayInfo."""
  counts = collections.Counter()
  batches = iter(dataset)
  for _ in range(warm_up):
    next(batches)
  for _ in range(dist.SAMPLES // dist.BATCH):
    _, info = next(batches)
    counts.update(zip(info.shard.numpy()[:, 0].tolist(),
                      info.key.numpy()[:, 0].tolist()))
  return counts, info


def _by_shard(counts):
  total = collections.Counter()
  for (shard, _), n in counts.items():
    total[shard] += n
  return total


def test_uniform_shards_sample_every_item_equally(sharded):
  managers = sharded(tables.TableConfig(name='experience'))
  counts, info = _count(_dataset(managers))
  assert len(counts) == sum(ITEMS)  # Every item of every shard was drawn.
  expected = {k: dist.SAMPLES / sum(ITEMS) for k in counts}
  assert dist._p_value(counts, expected) > 1e-4  # pylint: disable=protected-access
  by_shard = {s: dist.SAMPLES * n / sum(ITEMS) for s, n in enumerate(ITEMS)}
  assert dist._p_value(_by_shard(counts), by_shard) > 1e-4  # pylint: disable=protected-access
  equal = {s: dist.SAMPLES / 3 for s in range(3)}  # The wrong mix.
  assert dist._p_value(_by_shard(counts), equal) < 1e-6  # pylint: disable=protected-access
  np.testing.assert_array_equal(info.weight.numpy(), 1.0)


def test_prioritized_shards_sample_by_priority_over_the_whole_buffer(
    sharded):
  priorities = (1.0, 2.0, 4.0)
  managers = sharded(tables.TableConfig(
      name='experience', sampler='prioritized', priority_exponent=1.0),
                     priorities=priorities)
  counts, info = _count(_dataset(
      managers, beta=lambda: tf.constant(1.0, tf.float64)))
  mass = [n * p for n, p in zip(ITEMS, priorities)]
  expected = {(s, k): dist.SAMPLES * priorities[s] / sum(mass)
              for (s, k) in counts}
  assert len(counts) == sum(ITEMS)
  assert dist._p_value(counts, expected) > 1e-4  # pylint: disable=protected-access
  by_shard = {s: dist.SAMPLES * m / sum(mass) for s, m in enumerate(mass)}
  assert dist._p_value(_by_shard(counts), by_shard) > 1e-4  # pylint: disable=protected-access
  by_size = {s: dist.SAMPLES * n / sum(ITEMS) for s, n in enumerate(ITEMS)}
  assert dist._p_value(_by_shard(counts), by_size) < 1e-6  # pylint: disable=protected-access
  # Importance weights over the whole buffer: (N P(i))^-1, P(i) = p_i/sum.
  source = info.shard.numpy()[:, 0]
  weight = info.weight.numpy()[:, 0]
  want = 1.0 / (sum(ITEMS) * np.array(priorities)[source] / sum(mass))
  np.testing.assert_allclose(weight, want / want.max(), rtol=1e-5)


def test_shards_of_other_configs_are_refused():
  configs = [tables.TableConfig(name='experience').resolve(
      capacity=10, sequence_length=2, stride_length=1),
             tables.TableConfig(name='experience', sampler='prioritized')
             .resolve(capacity=10, sequence_length=2, stride_length=1)]
  with pytest.raises(ValueError, match="shard 1 serves table 'experience' "
                     "with sampler='prioritized'"):
    mixable.check_shards(configs)
  queue = tables.TableConfig(name='q', sampler='fifo').resolve(
      capacity=10, sequence_length=2, stride_length=1)
  with pytest.raises(ValueError, match='queues'):
    mixable.check_shards([queue, queue])


def _mixed(managers, starter, fraction, online_beta=None):
  """The one batcher over the managers' shards and a starter table."""
  sources = [sources_lib.Source(m.server_address, m.table_configs[0],
                                group=0, shard=k, size=m.num_frames(),
                                watched=True)
             for k, m in enumerate(managers)]
  sources.append(sources_lib.Source(starter.server_address,
                                    starter.table_configs[0], group=1,
                                    size=starter.num_frames()))
  dataset, _ = dataset_lib.make_dataset(
      sources, plan=batcher.SamplingPlan(batch_size=dist.BATCH, timeout_s=10),
      shares=lambda: tf.constant([1.0 - fraction, fraction], tf.float64),
      output=dataset_lib.Output(
          layout=layouts.make_layout('columns', dist._spec()),  # pylint: disable=protected-access
          betas=[online_beta, None]))
  return dataset


def test_a_starter_mixed_into_a_sharded_buffer(sharded, tmp_path):
  """Every online item 0.75 / 252, every starter item 0.25 / 42: the starter
  gets its fraction, the shards theirs by size, each item uniform within."""
  managers = sharded(tables.TableConfig(name='experience'))
  starter = manager_lib.ReplayBufferManager(
      dist._spec(), capacity=1000, layout='columns',  # pylint: disable=protected-access
      checkpoint_dir=str(tmp_path / 'starter'),
      table_configs=[tables.TableConfig(name='experience')])
  starter.create_replay_buffer()
  dist._write(starter.make_observer())  # pylint: disable=protected-access
  try:
    counts = collections.Counter()
    batches = iter(_mixed(managers, starter, 0.25))
    for _ in range(4):
      next(batches)
    for _ in range(dist.SAMPLES // dist.BATCH):
      _, info = next(batches)
      counts.update(zip(info.source.numpy()[:, 0].tolist(),
                        info.shard.numpy()[:, 0].tolist(),
                        info.key.numpy()[:, 0].tolist()))
      np.testing.assert_array_equal(info.weight.numpy(), 1.0)
    assert len(counts) == sum(ITEMS) + 42  # Every item of both buffers.
    expected = {(g, s, k): dist.SAMPLES * (0.25 / 42 if g else
                                           0.75 / sum(ITEMS))
                for (g, s, k) in counts}
    assert dist._p_value(counts, expected) > 1e-4  # pylint: disable=protected-access
    by_source = collections.Counter()
    for (group, shard, _), n in counts.items():
      by_source[(group, shard)] += n
    want = {(0, s): dist.SAMPLES * 0.75 * n / sum(ITEMS)
            for s, n in enumerate(ITEMS)}
    want[(1, 0)] = dist.SAMPLES * 0.25
    assert dist._p_value(by_source, want) > 1e-4  # pylint: disable=protected-access
    wrong = {key: dist.SAMPLES / 4 for key in want}  # Each source alike.
    assert dist._p_value(by_source, wrong) < 1e-6  # pylint: disable=protected-access
  finally:
    starter.close()
