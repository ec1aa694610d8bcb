"""Coordinated checkpoints of a buffer sharded over three in-process servers.

A learner's `checkpoint()` writes one coordinated checkpoint (every shard
saves, then the record of all of them is written to every shard);
`load_replay_buffer()` brings every shard back to the newest complete one.
A learner killed (SIGKILL) at each step of a save, or a shard whose save
fails, leaves a half-finished one that restores ignore.
"""

import multiprocessing
import queue

import pytest

import smart_replay
from smart_replay.backends import coordinated_checkpoints
from smart_replay.storage import store as checkpoint_store
from tests import testing
from tests.smart_replay.remote import in_process_shards
from tests.smart_replay.remote import remote_workers

SPAWN = multiprocessing.get_context('spawn')
shards = in_process_shards.shards


def _three(start):
  """Three served shards: `(addresses, servers)`."""
  return start(3), start.servers


def _client(addresses, data_spec, **kwargs):
  return in_process_shards.client(addresses, data_spec, **kwargs)[0]


def _write(addresses, data_spec, steps):
  """Writes `steps[k]` steps to shard k; returns the items each got."""
  written = []
  for shard, count in enumerate(steps):
    manager = _client(addresses, data_spec, actor_id=shard)
    if count:
      testing.run_actor(manager.observer, count, seed=shard)
    manager.flush()
    written.append(manager.observer.num_items)
    manager.close()
  return written


def _sizes(servers):
  return [s.manager.stats()['tables']['experience']['items'] for s in servers]


def _recorded_sizes(record):
  return [s['counts']['tables']['experience']['items']
          for s in record['shards']]


def test_a_restore_brings_every_shard_back_to_the_coordinated_checkpoint(
    shards, data_spec):
  addresses, servers = _three(shards)
  _write(addresses, data_spec, [20, 40, 60])
  learner = _client(addresses, data_spec)
  lines = learner.checkpoint(extra={'train_step': 7}).splitlines()
  learner.close()
  assert lines[0].startswith('coordinated ')
  saved = _sizes(servers)
  assert [line.split(' ')[0] for line in lines[1:]] == addresses
  # An actor keeps writing to shard 1; its items after the save are lost
  # by the restore, and it counts them.
  actor = _client(addresses, data_spec, actor_id=1)
  testing.run_actor(actor.observer, 30, seed=9)
  actor.flush()
  _write(addresses, data_spec, [10, 0, 10])
  assert _sizes(servers) != saved

  restorer = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=addresses)
  restorer.load_replay_buffer()
  try:
    assert _sizes(servers) == saved
    assert restorer.loaded_checkpoint == lines[0]
    assert restorer.loaded_manifest['extra'] == {'train_step': 7}
    assert restorer.loaded_manifest['counts']['tables']['experience'][
        'items'] == sum(saved)
    assert restorer.stats()['tables']['experience']['items'] == sum(saved)
    assert [s.restart_loss['lost_items'] for s in servers] == [
        9, actor.observer.num_items, 9]
    actor.flush()  # The restart is seen: the actor counts what it lost.
    assert actor.observer.num_lost_items == actor.observer.num_items > 0
    # A later restart of a shard resumes the restored state: it is saved
    # again as the newest checkpoint.
    for server in servers:
      newest = server.manager.existing_checkpoints()[-1]
      assert server.last_checkpoint == newest
      assert newest.endswith('ckpt-000002')
  finally:
    actor.close()
    restorer.close()


def test_restore_needs_a_complete_coordinated_checkpoint(shards, data_spec):
  addresses, _ = _three(shards)
  restorer = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=addresses)
  with pytest.raises(smart_replay.CheckpointNotFoundError,
                     match=r'no complete coordinated checkpoint on all 3 '
                     r'shards(.|\n)*shard 0 \(localhost:\d+\): recorded \[\]'):
    restorer.load_replay_buffer()
  restorer.close()
  with pytest.raises(ValueError, match='a coordinated checkpoint id looks '
                     "like .*, got 'ckpt-1'"):
    smart_replay.ReplayBufferManager(
        data_spec=data_spec, server_address=addresses).load_replay_buffer(
            'ckpt-1')


def test_a_shard_that_fails_its_save_leaves_a_checkpoint_restores_ignore(
    shards, data_spec, monkeypatch):
  addresses, servers = _three(shards)
  _write(addresses, data_spec, [20, 20, 20])
  learner = _client(addresses, data_spec)
  first = learner.checkpoint().splitlines()[0]
  _write(addresses, data_spec, [10, 10, 10])
  calls = []

  def fail_once(step):
    if step == 'hashed':
      calls.append(step)
      if len(calls) == 2:
        raise OSError(28, 'No space left on device')
  with monkeypatch.context() as patch:
    patch.setattr(checkpoint_store, '_fault_point', fail_once)
    with pytest.raises(smart_replay.CheckpointWriteError,
                       match=r'failed on 1 of 3 shard\(s\): shard \d '
                       r'\(localhost:\d+\): .*No space left'):
      learner.checkpoint()
  learner.close()
  restorer = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=addresses)
  restorer.load_replay_buffer()
  assert restorer.loaded_checkpoint == first
  assert _sizes(servers) == _recorded_sizes(
      restorer.loaded_manifest[coordinated_checkpoints.EXTRA_KEY])
  restorer.close()


def _save_and_die(addresses, step):
  """Runs a learner that dies at `step` of a coordinated save; returns its
  last message."""
  results = SPAWN.Queue()
  process = SPAWN.Process(target=remote_workers.coordinated_save_and_die,
                          args=(addresses, step, results))
  process.start()
  messages = []
  try:
    while True:
      try:
        message = results.get(timeout=120)
      except queue.Empty as e:
        raise AssertionError(f'the learner said nothing in 120 s after '
                             f'{messages}') from e
      messages.append(message)
      if message[0] in ('dying', 'survived'):
        break
  finally:
    process.join(60)
    if process.is_alive():
      process.kill()
  return messages[-1]


@pytest.mark.parametrize('step', coordinated_checkpoints.STEPS)
def test_a_learner_killed_at_each_step_of_a_save_restores_one_checkpoint(
    shards, data_spec, step):
  addresses, servers = _three(shards)
  _write(addresses, data_spec, [20, 30, 40])
  learner = _client(addresses, data_spec)
  before = learner.checkpoint().splitlines()[0]
  learner.close()
  saved = _sizes(servers)
  _write(addresses, data_spec, [10, 10, 10])
  grown = _sizes(servers)

  assert _save_and_die(addresses, step) == ('dying', step)
  restorer = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=addresses)
  restorer.load_replay_buffer()
  try:
    complete = step == coordinated_checkpoints.STEPS[-1]
    assert (restorer.loaded_checkpoint == before) != complete
    assert _sizes(servers) == (grown if complete else saved)
    assert _sizes(servers) == _recorded_sizes(
        restorer.loaded_manifest[coordinated_checkpoints.EXTRA_KEY])
  finally:
    restorer.close()
