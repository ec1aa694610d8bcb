"""Tests for smart_replay.sampling.dataset through the manager on a real server."""

import time

import numpy as np
import pytest
import tensorflow as tf
import tree

from tests import testing


def _filled(make_manager, steps=120, **kwargs):
  manager = make_manager(**kwargs)
  _, observer = manager.create_replay_buffer()
  record = testing.run_actor(observer, steps)
  observer.flush()
  return manager, record


def test_batches_have_learner_shapes_dtypes_and_written_content(
    make_manager, data_spec):
  manager, record = _filled(make_manager, sequence_length=3)
  written = {testing.item_fingerprint(i)
             for i in testing.expected_items(record.steps, 3)}
  trajectory, info = next(iter(manager.get_dataset(batch_size=16)))
  for spec, tensor in zip(tf.nest.flatten(data_spec),
                          tf.nest.flatten(trajectory)):
    assert tensor.dtype == spec.dtype
    assert tensor.shape == [16, 3] + spec.shape.as_list()
  assert info.key.shape == [16, 3] and info.probability.shape == [16, 3]
  for b in range(16):
    item = tree.map_structure(lambda t: t[b].numpy(), trajectory)
    assert testing.item_fingerprint(item) in written
  # The broadcast info is constant along time, as TF-Agents expects.
  assert (info.key.numpy() == info.key.numpy()[:, :1]).all()


def test_num_steps_divisor_splits_items(make_manager):
  manager, record = _filled(make_manager, sequence_length=4)
  halves = set()
  for item in testing.expected_items(record.steps, 4):
    for part in (0, 1):
      halves.add(testing.item_fingerprint(
          tree.map_structure(lambda x: x[2 * part:2 * part + 2], item)))
  trajectory, info = next(iter(manager.get_dataset(batch_size=8, num_steps=2)))
  assert trajectory.reward.shape == [8, 2] and info.key.shape == [8, 2]
  for b in range(8):
    assert testing.item_fingerprint(
        tree.map_structure(lambda t: t[b].numpy(), trajectory)) in halves


@pytest.mark.parametrize('num_steps', [3, 0, 5])
def test_num_steps_must_divide_sequence_length(make_manager, num_steps):
  manager = make_manager(sequence_length=4)
  manager.create_replay_buffer()
  with pytest.raises(ValueError, match=rf'num_steps={num_steps}.*sequence_length=4'):
    manager.get_dataset(batch_size=4, num_steps=num_steps)


def test_empty_buffer_times_out_with_reason_then_recovers(make_manager):
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  dataset = manager.get_dataset(batch_size=4, sample_timeout_s=0.5)
  start = time.monotonic()
  with pytest.raises(tf.errors.OpError) as raised:
    next(iter(dataset))
  elapsed = time.monotonic() - start
  assert 0.4 < elapsed < 5, elapsed
  message = str(raised.value)
  assert 'WaitTimeoutError' in message and 'table `experience`' in message
  assert 'nothing could be sampled' in message
  assert 'min_size_to_sample=1' in message
  # Once data arrives, a new iterator over the same dataset samples again.
  testing.run_actor(observer, 30)
  observer.flush()
  trajectory, _ = next(iter(dataset))
  assert trajectory.reward.shape[0] == 4
  assert np.isfinite(trajectory.reward.numpy()).all()


def test_the_same_iterator_resumes_after_a_timeout(make_manager):
  # tf_agents.train.Learner keeps one iterator for its whole life.
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  iterator = iter(manager.get_dataset(batch_size=4, sample_timeout_s=0.5))
  with pytest.raises(tf.errors.OpError, match='WaitTimeoutError'):
    next(iterator)
  testing.run_actor(observer, 30)
  observer.flush()
  # Timeouts that happened while the actor ran may still be buffered
  # (prefetch holds two, one more may be in flight); then data comes.
  for _ in range(10):
    try:
      trajectory, _ = next(iterator)
      break
    except tf.errors.OpError as e:
      assert 'WaitTimeoutError' in str(e)
  assert trajectory.reward.shape == [4, 2]


def test_items_deleted_by_sampling_are_all_delivered(make_manager):
  from smart_replay.config import tables  # pylint: disable=g-import-not-at-top
  manager = make_manager(table_configs=[tables.TableConfig(
      max_times_sampled=1)])
  _, observer = manager.create_replay_buffer()
  record = testing.run_actor(observer, 60)
  observer.flush()
  written = len(testing.expected_items(record.steps, 2))
  assert written % 8  # So that the last batch is partial.
  keys = []
  iterator = iter(manager.get_dataset(batch_size=8, sample_timeout_s=0.5))
  with pytest.raises(tf.errors.OpError, match='WaitTimeoutError'):
    while True:
      _, info = next(iterator)
      keys += info.key[:, 0].numpy().tolist()
  assert len(keys) == len(set(keys)) == written
  assert manager.num_frames() == 0


def test_unknown_table_and_bad_batch_size(make_manager):
  manager = make_manager()
  manager.create_replay_buffer()
  with pytest.raises(ValueError, match="unknown table_name 'nope'"):
    manager.get_dataset(batch_size=4, table_name='nope')
  with pytest.raises(ValueError, match='batch_size'):
    manager.get_dataset(batch_size=0)
