"""A buffer sharded over three `smart-replay-serve` processes with six
actor processes (two pinned to each shard) and a learner process (and the
same test on one server with two actors); one shard is killed (`kill -9`)
and restarted while they run.

Sampling must never stop (with shards, the learner goes on from the others
while one is down; with one server it waits), and the learner must sample
the restarted server again; the restart's loss must be counted by the
restarted server and by every actor pinned to it (and by no other); and the
counts must add up: each shard holds what its actors wrote, less what they
counted lost.
"""

import collections
import signal

import pytest

import smart_replay
from smart_replay.remote import serving_record
from tests import testing
from tests.smart_replay.remote import remote_workers
from tests.smart_replay.remote import serve_process

WORKERS, served = serve_process.WORKERS, serve_process.served
_get, _start = serve_process.get, serve_process.start
_wait_until = serve_process.wait_until

STEPS = 100


def _items(counters):
  return counters['items']['experience']


def _tables(stats, shard):
  """One shard's tables in `stats()` (one server: its only tables)."""
  return stats['shards'][shard]['tables'] if 'shards' in stats else (
      stats['tables'])


def _recorded_inserts(checkpoint_dir):
  record = serving_record.read(checkpoint_dir)
  return record and record['inserts']


# Two actors a shard show the loss counted by the killed shard's actors and
# by no other (each actor process costs seconds of CPU).
@pytest.mark.parametrize('num_shards, num_actors', [(3, 6), (1, 2)])
def test_actors_a_learner_and_a_shard_killed(served, tmp_path, num_shards,
                                             num_actors):
  dirs = [str(tmp_path / f'shard{k}') for k in range(num_shards)]
  shards = [served(checkpoint_dir=d) for d in dirs]
  addresses = [s.address for s in shards]
  killed = 1 % num_shards
  results = WORKERS.Queue()
  go = [WORKERS.Event() for _ in range(num_actors)]
  actors = [_start(remote_workers.pinned_actor, addresses, actor_id,
                   go[actor_id], results, 3, STEPS)
            for actor_id in range(num_actors)]
  reports = collections.defaultdict(dict)  # actor -> phase -> counters

  def phase(index):
    for event in go if index else ():
      event.set()
    for actor_id, got, counters in _get(results, num_actors):
      assert got == index
      reports[actor_id][got] = counters

  phase(0)
  per_source = WORKERS.Array('q', num_shards)
  stop = WORKERS.Event()
  learner = _start(remote_workers.sample_until_stopped, addresses, stop,
                   per_source, results)
  _wait_until(lambda: min(per_source[:]) > 0, 'the learner sampling every '
              'shard', 240)
  checkpointer, _ = remote_workers.client(addresses, actor_id=0)
  checkpointer.checkpoint()  # Coordinated over the shards.
  checkpointer.close()

  phase(1)  # Written after the checkpoint: the killed shard's are lost.
  pinned = [a for a in range(num_actors) if a % num_shards == killed]
  unsaved = sum(_items(reports[a][1]) - _items(reports[a][0]) for a in pinned)
  watcher, _ = remote_workers.client(addresses, actor_id=0)
  inserts = _tables(watcher.stats(), killed)['experience']['inserts']
  _wait_until(lambda: _recorded_inserts(dirs[killed]) == inserts,
              "the killed shard's serving record of every insert")
  assert shards[killed].stop(signal.SIGKILL) == -signal.SIGKILL

  if num_shards > 1:
    before = per_source[:]
    others = lambda: sum(per_source[:]) - per_source[killed]
    _wait_until(lambda: others() > sum(before) - before[killed] + 3000,
                'sampling while a shard is down')
    # At most what was in flight when it died: Reverb's 2 workers x 64
    # samples, the shard's feed (2 chunks queued, 1 in use, of 32) and the
    # learner's pipeline (2 prefetched batches, 2 in the pump's queue, 1 the
    # pump is putting, of 32); and then none at all.
    after = per_source[killed]
    assert after - before[killed] <= 2 * 64 + 3 * 32 + 5 * 32
    _wait_until(lambda: others() > sum(before) - before[killed] + 4000,
                'more sampling while a shard is down')
    assert per_source[killed] == after
    assert [s['up'] for s in watcher.stats()['shards']] == [
        k != killed for k in range(num_shards)]

  shards[killed] = served(checkpoint_dir=dirs[killed],
                          port=shards[killed].port)
  shards[killed].wait_for(f'at least {unsaved} item(s)', 60)
  back = per_source[killed]
  _wait_until(lambda: per_source[killed] > back + 500,
              'the restarted shard sampled again', 120)

  phase(2)
  for actor_id in range(num_actors):
    last = reports[actor_id][2]
    # The killed shard's actors sent again what it lacked: what they wrote
    # after the coordinated checkpoint (their manager's flush waits for it).
    resent = (_items(reports[actor_id][1]) - _items(reports[actor_id][0])
              if actor_id in pinned else 0)
    assert last['resent_items'] == resent, (actor_id, dict(reports))
    assert last['lost_items'] == last['lost_steps'] == 0
  stop.set()
  (name, learned), = _get(results, 1)
  assert name == 'learner'
  if num_shards > 1:
    sampling = [s['sampling'] for s in learned['shards']]
    assert sampling[killed]['down_events'] >= 1
    assert all(s['up'] for s in sampling)

  if num_shards > 1:
    # This client's channel to the restarted shard may still be backing off
    # (gRPC, seconds after an outage): until it answers, stats() shows the
    # shard down, with no tables.
    _wait_until(lambda: all(s['up'] for s in watcher.stats()['shards']),
                'this client seeing the restarted shard answer', 120)
  final = watcher.stats()
  for shard in range(num_shards):
    mine = [a for a in range(num_actors) if a % num_shards == shard]
    kept = sum(_items(reports[a][2]) - reports[a][2]['lost_items']
               for a in mine)
    assert _tables(final, shard)['experience']['items'] == kept
  assert final['tables']['experience']['items'] == sum(
      _items(r[2]) - r[2]['lost_items'] for r in reports.values())
  watcher.close()
  for process in actors + [learner]:
    process.join(60)
    assert process.exitcode == 0


def test_a_coordinated_restore_of_served_shards(served, tmp_path):
  """`smart-replay-serve` shards (configured by gin, as shipped) restore a
  coordinated checkpoint in place; a writer counts what it lost, and a shard
  killed afterwards resumes the restored state."""
  dirs = [str(tmp_path / f'shard{k}') for k in range(2)]
  shards = [served(checkpoint_dir=d) for d in dirs]
  addresses = [s.address for s in shards]
  writers = [remote_workers.client(addresses, actor_id=k) for k in range(2)]
  for k, (_, observer) in enumerate(writers):
    testing.run_actor(observer, 40, seed=k)
    observer.flush()
  learner, _ = remote_workers.client(addresses, actor_id=0)
  coordinated_line = learner.checkpoint().splitlines()[0]
  saved = [_tables(learner.stats(), k)['experience']['items']
           for k in range(2)]
  writer, observer = writers[1]
  testing.run_actor(observer, 30, seed=7)
  observer.flush()
  learner.close()

  restorer = smart_replay.ReplayBufferManager(
      data_spec=remote_workers.data_spec(), server_address=addresses)
  restorer.load_replay_buffer()
  assert restorer.loaded_checkpoint == coordinated_line
  assert [_tables(restorer.stats(), k)['experience']['items']
          for k in range(2)] == saved
  writer.flush()  # Shard 1's writer's manager sees the restart: it counts,
  # and sends nothing again (the restore was asked for).
  assert observer.num_lost_items == observer.num_lost_at_restart == (
      observer.num_items - saved[1]) > 0
  assert observer.num_resent_items == 0
  restorer.close()
  assert shards[1].stop(signal.SIGKILL) == -signal.SIGKILL
  shards[1] = served(checkpoint_dir=dirs[1], port=shards[1].port)
  again = smart_replay.ReplayBufferManager(
      data_spec=remote_workers.data_spec(), server_address=addresses)
  again.connect()
  assert [_tables(again.stats(), k)['experience']['items']
          for k in range(2)] == saved
  again.close()
  for manager, _ in writers:
    manager.close()
