"""Client mode over a buffer sharded across three in-process servers.

Each shard is a `ReplayServer` (the server of `smart-replay-serve`) on its
own port; client-mode managers given the list of addresses write to the
shard of their `actor_id` and sample, count, checkpoint and update
priorities over all of them.
"""

import collections
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import batched_py_environment
from tf_agents.policies import random_py_policy
from tf_agents.train import actor
from tf_agents.train.utils import train_utils

import smart_replay
from smart_replay.backends import sharded
from smart_replay.integrations import summaries
from tests import testing
from tests.smart_replay.remote import in_process_shards

shards = in_process_shards.shards
_client = in_process_shards.client


def test_actors_write_to_their_shard_and_learners_sample_all(shards,
                                                             data_spec):
  addresses = shards(3, table_configs=[smart_replay.TableConfig(
      sampler='prioritized', priority_exponent=1.0)])
  written = {}
  for actor_id, steps in ((0, 30), (1, 60), (5, 90)):  # 5 % 3: shard 2.
    manager, observer = _client(addresses, data_spec, actor_id=actor_id)
    assert manager.checkpoint_dir.endswith(f'shard{actor_id % 3}')
    testing.run_actor(observer, steps, seed=actor_id)
    manager.flush()
    written[actor_id % 3] = observer.num_items
    manager.close()
  learner, _ = _client(addresses, data_spec, actor_id=0)
  try:
    stats = learner.stats()
    assert [s['tables']['experience']['items'] for s in stats['shards']] == [
        written[0], written[1], written[2]]
    assert stats['tables']['experience']['items'] == sum(written.values())
    assert learner.num_frames() == sum(written.values())
    scalars = summaries.buffer_scalars(learner)
    assert [scalars[f'buffer/shard{s}/items'] for s in range(3)] == [
        written[0], written[1], written[2]]
    assert scalars['buffer/items'] == sum(written.values())
    sources = collections.Counter()
    batches = iter(learner.get_dataset(batch_size=64, num_steps=2))
    for _ in range(40):
      _, info = next(batches)
      sources.update(info.shard.numpy()[:, 0].tolist())
    # Equal priorities: shards in proportion to their sizes (1:2:3).
    share = np.array([sources[s] for s in range(3)]) / sum(sources.values())
    want = np.array([written[s] for s in range(3)]) / sum(written.values())
    np.testing.assert_allclose(share, want, atol=0.05)
    # A priority update goes to the shard holding each key: give shard 0's
    # items 20x the priority of the others', then shard 0 dominates.
    keys, origin = [], []
    for _ in range(20):
      _, info = next(batches)
      keys += info.key.numpy()[:, 0].tolist()
      origin += info.shard.numpy()[:, 0].tolist()
    priorities = np.where(np.array(origin) == 0, 20.0, 1.0)
    learner.update_priorities(np.array(keys, np.uint64), priorities,
                              shards=np.array(origin, np.int32))
    with pytest.raises(ValueError, match='needs shards='):
      learner.update_priorities(np.array(keys[:1], np.uint64), [1.0])
    with pytest.raises(ValueError, match=r'shards\[0\] = 3 is not a shard '
                       r'of this buffer \(0\.\.2'):
      learner.update_priorities(np.array(keys[:1], np.uint64), [1.0],
                                shards=np.array([3], np.int32))
    after = collections.Counter()
    batches = iter(learner.get_dataset(batch_size=64, num_steps=2))
    for _ in range(30):
      _, info = next(batches)
      after.update(info.shard.numpy()[:, 0].tolist())
    assert after[0] / sum(after.values()) > 0.5 > share[0]
    lines = learner.checkpoint(extra={'train_step': 7}).splitlines()
    assert lines[0].startswith('coordinated ')
    paths = lines[1:]
    assert [p.split(' ')[0] for p in paths] == addresses
    assert all(p.split(' ')[1].endswith('ckpt-000001') for p in paths)
  finally:
    learner.close()


def test_shards_of_another_config_are_refused(shards, data_spec):
  addresses = shards(2) + shards(1, sequence_length=3)
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=addresses)
  with pytest.raises(smart_replay.ManifestMismatchError,
                     match=r'shard 2 \(localhost:\d+\) serves another buffer'
                     r'(.|\n)*sequence_length'):
    manager.connect()
  manager.close()


@pytest.mark.parametrize('kwargs, message', [
    ({'server_address': ['h:1', 'h:1']}, 'distinct ones'),
    ({'server_address': []}, 'distinct ones'),
    ({'server_address': ['h:1', 'nohost']}, "server_address must be "
     "'host:port', got 'nohost'"),
    ({'server_address': ['h:1', 'h:2'], 'control_address': 'h:3'},
     'names one server'),
    ({'server_address': ['h:1', 'h:2'], 'actor_id': -1}, 'actor_id must be'),
    ({'server_address': ['h:1', 'h:2'], 'port': 5}, 'client mode'),
])
def test_sharded_arguments_are_checked(data_spec, kwargs, message):
  with pytest.raises(ValueError, match=message):
    smart_replay.ReplayBufferManager(data_spec=data_spec, **kwargs)


def test_the_writer_shard_is_stable_by_actor_id():
  assert [sharded.writer_shard(i, 3) for i in range(6)] == [0, 1, 2, 0, 1, 2]
  assert sharded.writer_shard(None, 3) == sharded.writer_shard(None, 3)


def _draw(batches, count, timeout_s=60):
  """Sources of `count` batches; fails (does not hang) after `timeout_s`."""
  sources = []

  def draw():
    for _ in range(count):
      sources.extend(next(batches)[1].shard.numpy()[:, 0].tolist())
  worker = threading.Thread(target=draw, daemon=True)
  worker.start()
  worker.join(timeout_s)
  assert not worker.is_alive(), f'sampling stopped after {len(sources)}'
  return collections.Counter(sources)


def _returns(call, timeout_s=30):
  """Runs `call`; fails (does not hang) if it has not returned in time."""
  worker = threading.Thread(target=call, daemon=True)
  worker.start()
  worker.join(timeout_s)
  assert not worker.is_alive(), f'{call} did not return in {timeout_s} s'


def test_sampling_goes_on_while_a_shard_is_down_and_takes_it_back(
    shards, data_spec, tmp_path):
  addresses = shards(3, table_configs=[smart_replay.TableConfig(
      sampler='prioritized', priority_exponent=1.0)])
  for actor_id in range(3):
    manager, observer = _client(addresses, data_spec, actor_id=actor_id)
    testing.run_actor(observer, 40, seed=actor_id)
    manager.flush()
    manager.close()
  learner, _ = _client(addresses, data_spec, actor_id=0)
  batches = iter(learner.get_dataset(batch_size=16, num_steps=2))
  assert set(_draw(batches, 30)) == {0, 1, 2}
  _, info = next(batches)
  keys, origin = info.key.numpy()[:, 0], info.shard.numpy()[:, 0]
  down = shards.servers[2]
  down.close(final_checkpoint=True)  # Shard 2 stops answering.
  _draw(batches, 200)  # Goes on; the watcher notices within a second.
  assert set(_draw(batches, 50)) == {0, 1}
  # A priority update returns (Reverb's update would wait for shard 2
  # forever): its keys are dropped, the others' priorities are set.
  _returns(lambda: learner.update_priorities(
      keys, np.full(len(keys), 5.0), shards=origin))
  answering = set(keys[origin != 2].tolist())
  seen = set()
  for _ in range(200):  # Windows sampled before the update come first.
    _, info = next(batches)
    seen |= {round(float(p), 3) for k, p in zip(
        info.key.numpy()[:, 0], info.priority.numpy()[:, 0]) if k in answering}
    if 5.0 in seen:
      break
  assert 5.0 in seen, seen
  stats = learner.stats()
  assert [s['up'] for s in stats['shards']] == [True, True, False]
  assert stats['shards'][2]['sampling'] == {'up': False, 'down_events': 1}
  scalars = summaries.buffer_scalars(learner)
  assert [scalars[f'buffer/shard{k}/up'] for k in range(3)] == [1, 1, 0]
  assert 'buffer/shard2/items' not in scalars
  assert scalars['buffer/items'] == sum(
      s['tables']['experience']['items'] for s in stats['shards'][:2])
  # Shard 2 comes back on its port, from its checkpoint: sampled again.
  shards.restart(2)
  deadline = time.monotonic() + 30
  while 2 not in _draw(batches, 20):
    assert time.monotonic() < deadline, 'shard 2 was not sampled again'
  assert learner.stats()['shards'][2]['sampling']['up']
  learner.close()


def test_a_shard_that_times_out_raises_then_the_iterator_samples_again(
    shards, data_spec):
  addresses = shards(2)
  manager, observer = _client(addresses, data_spec, actor_id=0)
  testing.run_actor(observer, 30)
  manager.flush()
  learner = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=addresses, sample_timeout_s=2.0)
  learner.connect()
  # The one Python thread of a client: its manager's watcher.
  watchers = lambda: sum(t.name == 'smart_replay-watch'
                         for t in threading.enumerate())
  batches = iter(learner.get_dataset(batch_size=16, num_steps=2))
  with pytest.raises(tf.errors.OpError, match=r'(?s)Timed out after 2 s '
                     r"waiting to sample from Reverb table `experience`"):
    for _ in range(20):  # Shard 1 is empty: a draw from it times out.
      next(batches)
  writer, observer = _client(addresses, data_spec, actor_id=1)
  testing.run_actor(observer, 30, seed=1)
  writer.flush()
  assert set(_draw(batches, 20)) == {0, 1}
  # Closing the manager ends its watcher and the dataset's feeds; its
  # iterator raises.
  running = watchers()
  learner.close()  # Joins its watcher.
  assert watchers() == running - 1
  with pytest.raises(tf.errors.OpError, match='was closed'):
    for _ in range(10):
      next(batches)
  writer.close()
  manager.close()


def test_a_batched_environment_writes_all_its_environments_to_one_shard(
    shards, data_spec):
  addresses = shards(3)
  envs = [testing.make_env(seed=i) for i in range(4)]
  policy = random_py_policy.RandomPyPolicy(
      envs[0].time_step_spec(), envs[0].action_spec(),
      info_spec=testing.INFO_SPEC, outer_dims=(4,), seed=1)
  manager, observer = _client(addresses, data_spec, actor_id=5, num_envs=4)
  actor.Actor(batched_py_environment.BatchedPyEnvironment(envs), policy,
              train_utils.create_train_step(), steps_per_run=40,
              observers=[observer]).run()
  manager.flush()
  sizes = [s['tables']['experience']['items']
           for s in manager.stats()['shards']]
  assert sizes == [0, 0, observer.num_items] and observer.num_items > 30
  manager.close()


def test_a_client_of_shards_mixes_in_its_own_starter(shards, data_spec,
                                                     make_manager, tmp_path):
  """A learner of a sharded buffer serves a starter in its own process and
  mixes it into every batch; priority updates go to the shards only."""
  from tests.smart_replay.backends import test_starter  # pylint: disable=g-import-not-at-top
  addresses = shards(2, table_configs=[smart_replay.TableConfig(
      sampler='prioritized')])
  for actor_id in range(2):
    manager, observer = _client(addresses, data_spec, actor_id=actor_id)
    testing.run_actor(observer, 40, seed=actor_id)
    manager.flush()
    manager.close()
  starter_dir = test_starter.make_starter(
      make_manager, tmp_path / 'starter', steps=60, seed=5,
      table_configs=[smart_replay.TableConfig(sampler='prioritized')])
  with smart_replay.ReplayBufferManager.from_checkpoint(
      starter_dir, checkpoint_dir=str(tmp_path / 'reader')) as reader:
    reader.load_replay_buffer(starter_dir)
    starter_keys = set(testing.sample_all_items(reader))
  learner, _ = _client(addresses, data_spec, actor_id=0,
                       starter_dir=starter_dir)
  try:
    batches = iter(learner.get_dataset(batch_size=32, num_steps=2,
                                       starter_fraction=0.5))
    seen = collections.Counter()
    for _ in range(20):
      _, info = next(batches)
      for source, shard, key in zip(info.source.numpy()[:, 0],
                                    info.shard.numpy()[:, 0],
                                    info.key.numpy()[:, 0]):
        seen[(int(source), int(shard))] += 1
        if source == smart_replay.STARTER:
          assert int(key) in starter_keys
    assert set(seen) == {(smart_replay.ONLINE, 0), (smart_replay.ONLINE, 1),
                         (smart_replay.STARTER, 0)}
    share = sum(n for (s, _), n in seen.items() if s) / sum(seen.values())
    assert abs(share - 0.5) < 5 * np.sqrt(0.25 / sum(seen.values()))
    update = learner.priority_update_fn(priorities_fn=lambda loss: loss)
    experience = next(batches)
    update(experience, tf.fill([32], 7.0))  # Online keys only, per shard.
    assert learner.stats()['tables']['experience']['max_priority'] == (
        pytest.approx(7.0, abs=1e-3))
  finally:
    learner.close()
