"""Tests for smart_replay.manager.replay_buffer: the replay buffer a manager hands
out keeps the manager's guarantees for code written for stock TF-Agents."""

import time

import numpy as np
import pytest
import tensorflow as tf

from smart_replay.config import tables
import smart_replay
from smart_replay.manager import replay_buffer as replay_buffer_lib
from tests import testing


def test_the_manager_hands_out_a_managed_replay_buffer(make_manager):
  manager = make_manager()
  replay_buffer, _ = manager.create_replay_buffer()
  assert isinstance(replay_buffer, replay_buffer_lib.ManagedReplayBuffer)
  assert isinstance(replay_buffer.py_client, replay_buffer_lib.ManagedClient)
  testing.run_actor(manager.observer, 30)
  path = replay_buffer.py_client.checkpoint()
  assert manager.existing_checkpoints() == [path]


def test_as_dataset_yields_replay_info_with_weights(make_manager):
  manager = make_manager(table_configs=[tables.TableConfig(
      sampler='prioritized', importance_beta=1.0)])
  replay_buffer, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 60)
  manager.flush()
  trajectory, info = next(iter(replay_buffer.as_dataset(
      sample_batch_size=4, num_steps=2, num_parallel_calls=3)))
  assert isinstance(info, smart_replay.ReplayInfo)
  assert trajectory.step_type.shape == (4, 2)
  assert info.weight.shape == (4, 2) and info.weight.dtype == tf.float32
  assert np.all(info.weight.numpy() > 0) and np.all(info.weight <= 1)
  assert info.mask.numpy().all()
  # The same keys update priorities, as with get_dataset.
  manager.update_priorities(info.key, np.arange(1, 5, dtype=np.float64))


def test_as_dataset_without_batch_size_yields_single_items(make_manager):
  manager = make_manager(sequence_length=4)
  replay_buffer, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 40)
  manager.flush()
  trajectory, info = next(iter(replay_buffer.as_dataset(num_steps=2)))
  assert trajectory.step_type.shape == (2,)
  assert info.key.shape == (2,) and info.weight.shape == (2,)


def test_as_dataset_times_out_like_get_dataset(make_manager):
  manager = make_manager(sample_timeout_s=1.0)
  replay_buffer, _ = manager.create_replay_buffer()
  started = time.monotonic()
  with pytest.raises(tf.errors.OpError) as raised:
    next(iter(replay_buffer.as_dataset(sample_batch_size=2)))
  assert time.monotonic() - started < 30
  message = str(raised.value)
  assert 'WaitTimeoutError' in message and 'table `experience`' in message


def test_as_dataset_refuses_what_it_cannot_keep(make_manager):
  manager = make_manager()
  replay_buffer, _ = manager.create_replay_buffer()
  with pytest.raises(NotImplementedError, match='epoch'):
    replay_buffer.as_dataset(sample_batch_size=2,
                             single_deterministic_pass=True)
  with pytest.raises(NotImplementedError, match='dataset.map'):
    replay_buffer.as_dataset(sample_batch_size=2,
                             sequence_preprocess_fn=lambda t: t)
  with pytest.raises(ValueError, match='num_steps=3'):
    replay_buffer.as_dataset(sample_batch_size=2, num_steps=3)
