"""Real processes on loopback: one server, spawned actors and a learner.

The server is the `smart-replay-serve` binary (or a `ReplayServer` in a
spawned process); actors and learners are client-mode managers in processes
started with multiprocessing's `spawn` method.
"""

from concurrent import futures
import json
import os
import signal
import time

import pytest

import smart_replay
from smart_replay.control import credentials
from tests import testing
from tests.smart_replay.remote import remote_workers
from tests.smart_replay.remote import serve_process

WORKERS = serve_process.WORKERS
served = serve_process.served
_wait_until = serve_process.wait_until
_start = serve_process.start
_get = serve_process.get


def _flushed(observer):
  """Flushes `observer`; False if the server took longer than its timeout."""
  try:
    observer.flush()
  except smart_replay.ServerUnavailableError:
    raise
  except smart_replay.WaitTimeoutError:
    return False
  return True


_newest_checkpoint = serve_process.newest_checkpoint


def test_four_actors_and_a_learner_then_an_actor_killed(served, tmp_path):
  server = served()
  results = WORKERS.Queue()
  steps = {seed: 120 + 10 * seed for seed in range(4)}
  actors = [_start(remote_workers.write_steps, server.address, seed, n,
                   results) for seed, n in steps.items()]
  reports = _get(results, 4)
  for process in actors:
    process.join(60)
    assert process.exitcode == 0
  expected = {}
  for seed, fingerprints, counters in reports:
    assert counters['steps'] == counters['recorded_steps'] >= steps[seed]
    assert counters['lost_steps'] == counters['lost_items'] == 0
    assert counters['items']['experience'] == len(fingerprints)
    expected[seed] = fingerprints
  total = sum(len(f) for f in expected.values())

  learner = _start(remote_workers.sample_everything, server.address, total,
                   results)
  (size, seen, path), = _get(results, 1)
  learner.join(60)
  assert size == total  # Exact, after the actors flushed.
  stored = sorted(seen.values())
  assert stored == sorted(f for fs in expected.values() for f in fs)
  assert os.path.isdir(path)
  with open(os.path.join(path, 'manifest.json')) as f:
    manifest = json.load(f)
  # The server marks checkpoints clients asked for (their retention group).
  assert manifest['extra'] == {'learner': 'done', 'requested_by_client': True}
  assert manifest['counts']['tables']['experience']['items'] == total

  # kill -9 an actor mid-episode while another one writes.
  started = WORKERS.Event()
  doomed = _start(remote_workers.write_until_killed, server.address, 7,
                  started)
  survivor = _start(remote_workers.write_steps, server.address, 8, 300,
                    results)
  assert started.wait(120)
  remote_workers.kill(doomed)
  assert doomed.exitcode == -signal.SIGKILL
  (_, fingerprints, counters), = _get(results, 1)
  survivor.join(60)
  assert survivor.exitcode == 0 and counters['lost_steps'] == 0
  manager, _ = remote_workers.client(server.address)
  try:
    # The killed actor's flushed items stay too.
    assert manager.num_frames() > total + len(fingerprints)
    seen = testing.sample_all_items(manager, batch_size=64)
    assert set(fingerprints) <= set(seen.values())  # The survivor's data.
  finally:
    manager.close()
  assert server.process.poll() is None
  assert server.stop() == 0  # SIGTERM: a final checkpoint, exit 0.
  assert 'final' in server.log()


def test_server_killed_after_scheduled_checkpoint_resumes_it(served, tmp_path):
  checkpoint_dir = str(tmp_path / 'buffer')
  # Every 50 inserts, and the tail (< 50 items) once it is 1 s old: the
  # checkpoint that holds everything the actor wrote always comes.
  server = served('ReplayServer.checkpoint_every_inserts=50',
                  'ReplayServer.max_unsaved_s=1.0',
                  checkpoint_dir=checkpoint_dir)
  results, go = WORKERS.Queue(), WORKERS.Event()
  actor = _start(remote_workers.phased_actor, server.address, 3, go, results)
  (_, first), = _get(results, 1)
  items_written = first['items']['experience']
  # Wait for the scheduled checkpoint that holds everything, then kill -9.
  deadline = time.monotonic() + 60
  while True:
    path, held = _newest_checkpoint(checkpoint_dir)
    if held == items_written or time.monotonic() > deadline:
      break
    time.sleep(0.2)
  assert held == items_written, (held, items_written)
  server.stop(signal.SIGKILL)

  restarted = served(checkpoint_dir=checkpoint_dir, port=server.port)
  assert f'Resumed {path}' in restarted.log()
  manager, _ = remote_workers.client(restarted.address)
  try:
    assert manager.num_frames() == held  # Exactly the last checkpoint.
    go.set()  # The actor continues on its old connection.
    (_, second), = _get(results, 1)
    actor.join(60)
    assert actor.exitcode == 0
    assert second['lost_steps'] == second['lost_items'] == 0
    assert manager.num_frames() == second['items']['experience']
  finally:
    manager.close()


@pytest.fixture(scope='module')
def connect_only_server(tmp_path_factory):
  """One `smart-replay-serve` for the tests that only connect to it and
  write nothing (each server costs a process and TensorFlow's import)."""
  tmp_path = tmp_path_factory.mktemp('connect_only')
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv(credentials.TOKEN_FILE_ENV,
                 serve_process.shared_token_file(tmp_path))
    server = serve_process.ServeProcess(tmp_path, str(tmp_path / 'buffer'),
                                        remote_workers.free_port_pair())
    try:
      yield server
    finally:
      if server.process.poll() is None:
        server.stop(signal.SIGKILL)


def test_client_of_another_spec_lists_the_differences(connect_only_server):
  server = connect_only_server
  spec = remote_workers.data_spec()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  other = spec._replace(reward=tf.TensorSpec([2], tf.float32))
  manager = smart_replay.ReplayBufferManager(data_spec=other,
                                             server_address=server.address)
  with pytest.raises(smart_replay.ManifestMismatchError) as e:
    manager.connect()
  assert "data_spec/reward: server='float32[]', local='float32[2]'" in str(
      e.value)
  assert e.value.differences == [('data_spec/reward', 'float32[]',
                                  'float32[2]')]
  manager.close()


def test_client_takes_the_served_layout_and_refuses_another(
    connect_only_server):
  server = connect_only_server
  manager = smart_replay.ReplayBufferManager(
      data_spec=remote_workers.data_spec(), server_address=server.address,
      layout='columns')
  with pytest.raises(smart_replay.ManifestMismatchError,
                     match="layout: server='packed', local='columns'"):
    manager.connect()
  manager.close()
  manager = smart_replay.ReplayBufferManager(
      data_spec=remote_workers.data_spec(), server_address=server.address)
  manager.connect()
  assert manager.layout == 'packed'
  manager.close()


def test_unreachable_address_fails_within_the_timeout():
  port = remote_workers.free_port_pair()
  manager = smart_replay.ReplayBufferManager(
      data_spec=remote_workers.data_spec(),
      server_address=f'localhost:{port}', connect_timeout_s=2.0)
  began = time.monotonic()
  with pytest.raises(smart_replay.ServerUnavailableError,
                     match=f'localhost:{port} within 2 s'):
    manager.connect()
  assert time.monotonic() - began < 10
  manager.close()


_long_episode_steps = remote_workers.long_episode_steps


_served_writer = serve_process.served_writer
_kill_after_unsaved_items = serve_process.kill_after_unsaved_items


def test_actor_waits_through_a_server_restart_mid_episode(served, tmp_path,
                                                          caplog):
  checkpoint_dir = str(tmp_path / 'buffer')
  steps = _long_episode_steps(36)
  server, manager, observer = _kill_after_unsaved_items(
      served, checkpoint_dir, steps, write_timeout_s=2.0,
      reconnect_timeout_s=120.0, resend_bytes=0)  # Counts, no re-send.
  try:
    for step in steps[16:36]:  # Items (16,17).. reference a lost chunk.
      observer(step)
    # The flush waits for the server (started while it is down: a server
    # back before the flush, as on a busy host, would leave nothing to wait
    # for), then sends the pending items.
    with futures.ThreadPoolExecutor(1) as pool:
      flushed = pool.submit(observer.flush)
      _wait_until(lambda: 'does not answer' in caplog.text,
                  'the flush waiting for the server')
      restarted = served(checkpoint_dir=checkpoint_dir, port=server.port)
      assert 'at least 6 item(s) it inserted after' in restarted.log()
      flushed.result(timeout=180)
    assert observer.num_reconnects == 1
    # The 6 items confirmed after the checkpoint died with the server: the
    # reconnect woke the manager's watcher, which tells the observer.
    serve_process.wait_until(lambda: observer.num_lost_at_restart == 6,
                             "the watcher's count of the restart's loss", 30)
    assert observer.num_lost_steps == 0
    assert observer.num_lost_items == observer.num_lost_at_restart == 6
    assert manager.stats()['lost_items'] == 6
    seen = testing.sample_all_items(manager, batch_size=8)
    want = testing.expected_items(steps, 2)
    kept = want[:9] + want[15:]  # The checkpoint, and all written after kill.
    assert sorted(seen.values()) == sorted(
        testing.item_fingerprint(i) for i in kept)
  finally:
    manager.close()


def _restart_after_a_checkpoint(served, checkpoint_dir, **client_kwargs):
  """A client writes 10 steps, checkpoints, writes 6 more (confirmed, not
  saved); the server is killed and restarted, and nothing is written while it
  is down, so no write waits for it."""
  server, manager, observer = _kill_after_unsaved_items(
      served, checkpoint_dir, _long_episode_steps(16), **client_kwargs)
  restarted = served(checkpoint_dir=checkpoint_dir, port=server.port)
  assert 'at least 6 item(s) it inserted after' in restarted.log()
  return manager, observer


def test_a_restart_no_write_waited_for_is_counted_at_the_next_flush(
    served, tmp_path):
  manager, observer = _restart_after_a_checkpoint(
      served, str(tmp_path / 'buffer'), restart_check_s=3600.0,
      resend_bytes=0)
  try:
    assert observer.num_lost_items == 0  # Nothing has noticed yet.
    manager.flush()
    assert observer.num_reconnects == 0  # No write waited.
    assert observer.num_lost_items == observer.num_lost_at_restart == 6
    manager.flush()  # The same restart is counted once.
    assert manager.stats()['lost_items'] == 6
  finally:
    manager.close()


def test_the_periodic_check_counts_a_restart_without_any_call(served,
                                                              tmp_path):
  manager, observer = _restart_after_a_checkpoint(
      served, str(tmp_path / 'buffer'), restart_check_s=0.5, resend_bytes=0)
  try:
    _wait_until(lambda: observer.num_lost_items == 6,
                'the periodic check to count the 6 lost items')
    assert observer.num_lost_at_restart == 6
    assert observer.num_reconnects == 0
  finally:
    manager.close()


def test_actor_gives_up_after_reconnect_timeout_and_counts_the_loss(
    served, tmp_path):
  checkpoint_dir = str(tmp_path / 'buffer')
  server, manager, observer = _served_writer(
      served, checkpoint_dir, write_timeout_s=1.0, reconnect_timeout_s=3.0,
      resend_bytes=0)
  steps = _long_episode_steps(200)
  try:
    for step in steps[:10]:
      observer(step)
    observer.flush()
    assert manager.num_frames() == 9
    server.stop(signal.SIGKILL)
    items_before, written = observer.num_items, 0
    with pytest.raises(smart_replay.ServerUnavailableError,
                       match='did not answer for 4 s') as e:
      for step in steps[10:]:
        written += 1
        observer(step)
    assert 10 < written < 190  # Back-pressure stopped it within ~50 items.
    assert observer.num_lost_steps == written
    assert observer.num_lost_items == observer.num_items - items_before
    assert f'{written} step(s)' in str(e.value)
    # The server comes back (empty: it never checkpointed); the next steps
    # start a new episode on a new connection. Asking the server first, on
    # the observer's channel, ends gRPC's reconnect backoff (seconds after
    # an outage; longer than this observer's 1 + 3 s of patience).
    served(checkpoint_dir=checkpoint_dir, port=server.port)
    assert manager.num_frames() == 0
    for step in steps[10 + written:30 + written]:
      observer(step)
    # The fresh server may take longer than this observer's 1 s to confirm
    # the first items on a loaded machine: wait for them (a give-up would
    # still raise, and change the counts checked below).
    _wait_until(lambda: _flushed(observer), 'the server to confirm 19 items')
    assert manager.num_frames() == 19
    assert manager.stats()['lost_steps'] == written
  finally:
    manager.close()


def test_server_restarted_with_other_tables_fails_the_write(served, tmp_path):
  server, manager, observer = _served_writer(
      served, str(tmp_path / 'first'), write_timeout_s=1.0,
      reconnect_timeout_s=60.0, resend_bytes=0)
  steps = _long_episode_steps(40)
  try:
    for step in steps[:10]:
      observer(step)
    observer.flush()
    server.stop(signal.SIGKILL)
    for step in steps[10:20]:
      observer(step)
    served("experience/TableConfig.name='other'",  # Over serve.gin's name.
           checkpoint_dir=str(tmp_path / 'second'), port=server.port)
    with pytest.raises(smart_replay.WriteFailedError,
                       match="refused the writes of tables.*experience") as e:
      observer.flush()
    assert '10 step(s) and 10 item(s)' in str(e.value)
    assert observer.num_lost_steps == observer.num_lost_items == 10
  finally:
    try:
      manager.close()
    except smart_replay.SmartReplayError:
      pass
