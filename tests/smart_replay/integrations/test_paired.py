"""Tests for smart_replay.integrations.paired with a real agent and server."""

import logging
import os

import pytest
import tensorflow as tf
from tf_agents.policies import random_py_policy
from tf_agents.train.utils import train_utils

import smart_replay
from smart_replay.apps import agents
from smart_replay.apps.envs import factory
from smart_replay.integrations import paired as paired_checkpoint
from tests import testing


def _collect(manager, env, steps):
  policy = random_py_policy.RandomPyPolicy(env.time_step_spec(),
                                           env.action_spec())
  testing.run_actor(manager.observer, steps, env=env, policy=policy)


@pytest.fixture
def setup(tmp_path):
  env = factory.make_environment('gym:CartPole-v1')
  train_step = train_utils.create_train_step()
  agent = agents.make_agent(time_step_spec=env.time_step_spec(),
                            action_spec=env.action_spec(),
                            train_step=train_step)
  manager = smart_replay.ReplayBufferManager(
      agent.collect_data_spec, capacity=1000,
      checkpoint_dir=str(tmp_path / 'buffer'), keep_checkpoints=3)
  manager.create_replay_buffer()
  yield env, agent, train_step, manager, tmp_path
  manager.close()


def test_saves_on_interval_as_a_trigger_and_pairs_match(setup):
  env, agent, train_step, manager, tmp_path = setup
  paired = paired_checkpoint.PairedCheckpointer(
      manager, agent_dir=str(tmp_path / 'agent'), train_step=train_step,
      interval=100, agent=agent)
  _collect(manager, env, 50)
  saved = []
  for step in (50, 100, 150, 250):  # Counted from step 0, as a Learner would.
    train_step.assign(step)
    saved.append(paired(step))
  assert [p.train_step if p else None for p in saved] == [None, 100, None, 250]
  pairs = paired_checkpoint.find_pairs(str(tmp_path / 'buffer'),
                                       str(tmp_path / 'agent'))
  assert [p.train_step for p in pairs] == [250, 100]
  assert pairs[0].agent_checkpoint.endswith('ckpt-250')


def test_restore_brings_back_weights_and_train_step(setup):
  env, agent, train_step, manager, tmp_path = setup
  paired = paired_checkpoint.PairedCheckpointer(
      manager, agent_dir=str(tmp_path / 'agent'), train_step=train_step,
      interval=10, agent=agent)
  _collect(manager, env, 30)
  train_step.assign(42)
  pair = paired.save()
  weights = [w.numpy().copy() for w in agent.trainable_variables]
  for w in agent.trainable_variables:
    w.assign(tf.zeros_like(w))
  train_step.assign(0)
  paired.restore_agent(pair)
  assert int(train_step.numpy()) == 42
  for want, got in zip(weights, agent.trainable_variables):
    assert (want == got.numpy()).all()


def test_buffer_ahead_of_agent_resumes_from_the_pair_and_says_so(setup,
                                                                 caplog):
  env, agent, train_step, manager, tmp_path = setup
  paired = paired_checkpoint.PairedCheckpointer(
      manager, agent_dir=str(tmp_path / 'agent'), train_step=train_step,
      interval=10, agent=agent)
  _collect(manager, env, 30)
  train_step.assign(100)
  paired.save()
  train_step.assign(200)
  manager.checkpoint(extra={'train_step': 200})  # Crash before the agent.
  with caplog.at_level(logging.WARNING):
    pair = paired_checkpoint.newest_pair(str(tmp_path / 'buffer'),
                                         str(tmp_path / 'agent'))
  assert pair.train_step == 100
  assert any('step(s) [200] have no partner' in r.getMessage() and
             'dropped' in r.getMessage() for r in caplog.records)
  # Resuming sets the unpaired one aside (kept, not deleted).
  paired_checkpoint.set_aside_newer_than(pair, str(tmp_path / 'buffer'),
                                         str(tmp_path / 'agent'))
  assert sorted(paired_checkpoint.buffer_checkpoints(
      str(tmp_path / 'buffer'))) == [100]
  assert len(os.listdir(tmp_path / 'buffer' / 'orphaned')) == 1


def test_an_automatic_checkpoint_is_never_a_pair(setup):
  """An automatic checkpoint (the journals' bound) carries the step of the
  checkpoint before it, but holds more: it pairs with no agent checkpoint."""
  env, agent, train_step, manager, tmp_path = setup
  paired = paired_checkpoint.PairedCheckpointer(
      manager, agent_dir=str(tmp_path / 'agent'), train_step=train_step,
      interval=10, agent=agent)
  _collect(manager, env, 30)
  train_step.assign(100)
  pair = paired.save()
  _collect(manager, env, 30)
  manager.checkpoint(extra={'train_step': 100, 'automatic_checkpoint': True})
  assert paired_checkpoint.buffer_checkpoints(str(tmp_path / 'buffer')) == {
      100: pair.buffer_checkpoint}


def test_no_common_step_is_an_error_listing_both_sides(setup):
  _, _, _, manager, tmp_path = setup
  manager.checkpoint(extra={'train_step': 7})
  with pytest.raises(smart_replay.CheckpointNotFoundError,
                     match=r'Buffer checkpoints .* at steps \[7\], agent '
                     r'checkpoints .* at steps \[\]'):
    paired_checkpoint.newest_pair(str(tmp_path / 'buffer'),
                                  str(tmp_path / 'agent'))
  assert paired_checkpoint.newest_pair(str(tmp_path / 'none'),
                                       str(tmp_path / 'none2')) is None


def test_bad_arguments(setup):
  _, agent, train_step, manager, tmp_path = setup
  with pytest.raises(ValueError, match='interval must be a positive'):
    paired_checkpoint.PairedCheckpointer(
        manager, agent_dir=str(tmp_path / 'a'), train_step=train_step,
        interval=0, agent=agent)
  with pytest.raises(ValueError, match='keep must be a positive integer'):
    paired_checkpoint.PairedCheckpointer(
        manager, agent_dir=str(tmp_path / 'a'), train_step=train_step,
        interval=5, keep=0, agent=agent)
  with pytest.raises(ValueError, match='needs something to checkpoint'):
    paired_checkpoint.PairedCheckpointer(
        manager, agent_dir=str(tmp_path / 'a'), train_step=train_step,
        interval=5)
  assert not os.path.exists(tmp_path / 'a')
