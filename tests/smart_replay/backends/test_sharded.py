"""Client mode over a buffer sharded across three in-process servers.

Each shard is a `ReplayServer` (the server of `smart-replay-serve`) on its
own port; client-mode managers given the list of addresses write to the
shard of their `actor_id` and sample, count, checkpoint and update
priorities over all of them.
"""

import collections

import numpy as np
import pytest

import smart_replay
from smart_replay.backends import sharded
from smart_replay.integrations import summaries
from smart_replay.remote import replay_server as serve
from tests import testing
from tests.smart_replay.remote import remote_workers


@pytest.fixture
def shards(tmp_path, data_spec):
  """`start(n, **manager_kwargs)`: n servers; returns their addresses."""
  servers = []

  def start(n=3, **kwargs):
    for index in range(len(servers), len(servers) + n):
      port = remote_workers.free_port_pair()
      manager = smart_replay.ReplayBufferManager(
          data_spec=data_spec, capacity=1000,
          checkpoint_dir=str(tmp_path / f'shard{index}'), port=port,
          **{'sequence_length': 2, **kwargs})
      server = serve.ReplayServer(manager, control_port=port + 1)
      server.start()
      servers.append(server)
    return [s.manager.server_address for s in servers[-n:]]

  yield start
  for server in servers:
    server.close(final_checkpoint=False)


def _client(addresses, data_spec, **kwargs):
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=addresses, sample_timeout_s=10.0,
      write_timeout_s=10.0, **kwargs)
  _, observer = manager.connect()
  return manager, observer


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
      sources.update(info.source.numpy()[:, 0].tolist())
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
      origin += info.source.numpy()[:, 0].tolist()
    priorities = np.where(np.array(origin) == 0, 20.0, 1.0)
    learner.update_priorities(np.array(keys, np.uint64), priorities,
                              shards=np.array(origin, np.int32))
    with pytest.raises(ValueError, match='needs shards='):
      learner.update_priorities(np.array(keys[:1], np.uint64), [1.0])
    after = collections.Counter()
    batches = iter(learner.get_dataset(batch_size=64, num_steps=2))
    for _ in range(30):
      _, info = next(batches)
      after.update(info.source.numpy()[:, 0].tolist())
    assert after[0] / sum(after.values()) > 0.5 > share[0]
    paths = learner.checkpoint(extra={'train_step': 7}).splitlines()
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
