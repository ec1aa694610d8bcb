"""What is sampled: chi-square tests over >= 20,000 samples, on a real server.

Uniform tables sample every window equally in both layouts and with packed
items (any number of windows per block); a prioritized table samples item i
with probability p_i^alpha / sum_j p_j^alpha. Each test also checks that its
statistic rejects a wrong distribution, so a passing test is not vacuous.
"""

import collections
import math

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory

from smart_replay.config import tables
from smart_replay.manager import facade as manager_lib

SAMPLES = 20_480
BATCH = 256
# Episode lengths: short ones and ones ending mid-block, so blocks of every
# fill are stored.
LENGTHS = (3, 7, 10, 2, 13, 5, 9)


def _spec():
  return trajectory.Trajectory(
      step_type=tf.TensorSpec([], tf.int32, name='step_type'),
      observation=tf.TensorSpec([1], tf.float32, name='observation'),
      action=tensor_spec.BoundedTensorSpec([], tf.int32, 0, 3, name='action'),
      policy_info=(),
      next_step_type=tf.TensorSpec([], tf.int32, name='next_step_type'),
      reward=tf.TensorSpec([], tf.float32, name='reward'),
      discount=tf.TensorSpec([], tf.float32, name='discount'))


def _write(observer):
  """Writes episodes of `LENGTHS`; every step's observation is its index."""
  index = 0
  for length in LENGTHS:
    for t in range(length):
      step_type = 0 if t == 0 else (2 if t == length - 1 else 1)
      next_type = 2 if t >= length - 2 else 1
      observer(trajectory.Trajectory(
          step_type=np.int32(step_type),
          observation=np.array([index], np.float32),
          action=np.int32(t % 4), policy_info=(),
          next_step_type=np.int32(2 if step_type == 2 else next_type),
          reward=np.float32(t), discount=np.float32(1.0)))
      index += 1
  observer.flush()


def _windows(length):
  """The first step index of every window of `length` steps."""
  starts, first = [], 0
  for episode in LENGTHS:
    starts += [first + t for t in range(episode - length + 1)]
    first += episode
  return starts


def _p_value(counts, expected):
  """Upper tail of Pearson's chi-square (Wilson-Hilferty approximation)."""
  statistic = sum((counts.get(k, 0) - e) ** 2 / e for k, e in expected.items())
  dof = len(expected) - 1
  z = ((statistic / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(
      2 / (9 * dof))
  return 0.5 * math.erfc(z / math.sqrt(2))


def _sample(manager, table, length, every=1):
  """{first step index of the window: times sampled}, plus the infos.

  With `every` = k, counts `SAMPLES` windows taken k apart (the first of the
  k windows cut from each block: independent draws).
  """
  counts = collections.Counter()
  probabilities = set()
  dataset = manager.get_dataset(batch_size=BATCH, num_steps=length,
                                table_name=table, sample_timeout_s=10)
  for _, (trajectory_batch, info) in zip(range(every * SAMPLES // BATCH),
                                         dataset):
    observation = trajectory_batch.observation.numpy()[:, :, 0]
    # Every sampled window is consecutive steps of one episode.
    np.testing.assert_array_equal(
        observation, observation[:, :1] + np.arange(length))
    counts.update(int(v) for v in observation[::every, 0])
    probabilities.update(np.round(info.probability.numpy()[:, 0], 12))
  return counts, probabilities


def _manager(tmp_path, layout, *configs, sequence_length=2):
  manager = manager_lib.ReplayBufferManager(
      _spec(), capacity=1000, checkpoint_dir=str(tmp_path / layout),
      sequence_length=sequence_length, layout=layout,
      table_configs=list(configs))
  _, observer = manager.create_replay_buffer()
  _write(observer)
  return manager


@pytest.mark.parametrize('layout', ['columns', 'packed'])
def test_uniform_windows_in_both_layouts(tmp_path, layout):
  with _manager(tmp_path, layout, tables.TableConfig()) as manager:
    counts, probabilities = _sample(manager, 'experience', 2)
  starts = _windows(2)
  assert set(counts) == set(starts)
  expected = {s: SAMPLES / len(starts) for s in starts}
  assert _p_value(counts, expected) > 1e-4
  assert probabilities == {round(1 / len(starts), 12)}
  skewed = {s: SAMPLES * (2 if i % 2 else 1) / (1.5 * len(starts))
            for i, s in enumerate(starts)}
  assert _p_value(counts, skewed) < 1e-6  # The test has power.


@pytest.mark.parametrize('windows_per_item', [1, 4])
def test_packed_items_sample_every_window_uniformly(tmp_path, windows_per_item):
  config = tables.TableConfig(name='blocks', block_length=5,
                              windows_per_item=windows_per_item)
  with _manager(tmp_path, 'packed', config, sequence_length=3) as manager:
    stats = manager.stats()['tables']['blocks']
    # The windows of one block are drawn together: count one per block (the
    # others are as uniform, but not independent of it).
    counts, probabilities = _sample(manager, 'blocks', 3,
                                    every=windows_per_item)
  starts = _windows(3)
  assert set(counts) == set(starts)
  assert stats['windows_per_block'] == 3
  assert stats['items'] < len(starts) <= stats['windows_at_most']
  expected = {s: SAMPLES / len(starts) for s in starts}
  assert _p_value(counts, expected) > 1e-4
  # Each window's probability is the block's divided by its windows: 1/N.
  assert probabilities == {round(1 / len(starts), 12)}


def test_prioritized_samples_p_to_the_alpha(tmp_path):
  alpha = 0.7
  config = tables.TableConfig(name='per', sampler='prioritized',
                              priority_exponent=alpha, initial_priority=1.0)
  with _manager(tmp_path, 'packed', config) as manager:
    # Learn each item's key from one pass, then give item of window s the
    # priority 1 + (s % 5).
    keys = {}
    for trajectory_batch, info in manager.get_dataset(
        batch_size=BATCH, table_name='per', sample_timeout_s=10).take(20):
      for start, key in zip(trajectory_batch.observation.numpy()[:, 0, 0],
                            info.key.numpy()[:, 0]):
        keys[int(start)] = key
    starts = _windows(2)
    assert set(keys) == set(starts)
    priority = {s: 1.0 + s % 5 for s in starts}
    manager.update_priorities(
        np.array([keys[s] for s in starts], np.uint64),
        np.array([priority[s] for s in starts], np.float64), table_name='per')
    counts, _ = _sample(manager, 'per', 2)
  weight = {s: (p + 1e-6) ** alpha for s, p in priority.items()}
  total = sum(weight.values())
  expected = {s: SAMPLES * w / total for s, w in weight.items()}
  assert _p_value(counts, expected) > 1e-4
  uniform = {s: SAMPLES / len(starts) for s in starts}
  assert _p_value(counts, uniform) < 1e-6  # Priorities matter.
