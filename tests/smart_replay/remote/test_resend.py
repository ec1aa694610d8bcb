"""Writers send again exactly what a restarted server lacks.

A real `smart-replay-serve` is killed -9 and started again with the same
command while client-mode observers write; each observer keeps what it sent
(`storage.retained`), asks the restarted server what it has of its items (an
exact snapshot) and sends again the rest (`resending.Resender.resend`). The
check reads the server's final checkpoint: every item each writer wrote is
there exactly once.
"""

from concurrent import futures
import collections
import signal

from smart_replay.storage import reader as checkpoint_reader
from smart_replay.writing import resending
from tests import testing
from tests.smart_replay.remote import remote_workers
from tests.smart_replay.remote import serve_process

served = serve_process.served


def _stored_fingerprints(path):
  """Every item of the checkpoint's experience table, as a multiset."""
  reader = checkpoint_reader.CheckpointReader(path)
  spec = remote_workers.data_spec()
  return collections.Counter(
      testing.item_fingerprint(checkpoint_reader.unflatten(spec, item.columns))
      for item in reader.items('experience'))


def _final_checkpoint(server):
  """Stops the server with SIGTERM; returns its final checkpoint."""
  assert server.stop() == 0
  path, _ = serve_process.newest_checkpoint(server.checkpoint_dir)
  return path


def _restart_mid_episode(served, tmp_path, caplog):
  """A client writes 10 steps of one long episode, checkpoints, writes 6
  more (confirmed, not saved) and the server is killed
  (`serve_process.kill_after_unsaved_items`); 20 more steps are written
  while it is down, and it is started again while the client's flush waits
  for it. Returns `(server, manager, observer, steps)`."""
  checkpoint_dir = str(tmp_path / 'buffer')
  steps = remote_workers.long_episode_steps(36)
  server, manager, observer = serve_process.kill_after_unsaved_items(
      served, checkpoint_dir, steps, write_timeout_s=2.0,
      reconnect_timeout_s=120.0)
  try:
    for step in steps[16:36]:  # Sent again by Reverb after the restart.
      observer(step)
    with futures.ThreadPoolExecutor(1) as pool:
      flushed = pool.submit(observer.flush)
      serve_process.wait_until(lambda: 'does not answer' in caplog.text,
                               'the flush waiting for the server')
      restarted = served(checkpoint_dir=checkpoint_dir, port=server.port)
      flushed.result(timeout=180)
  except BaseException:
    manager.close()
    raise
  return restarted, manager, observer, steps


def test_a_restart_mid_episode_loses_nothing(served, tmp_path, caplog):
  server, manager, observer, steps = _restart_mid_episode(served, tmp_path,
                                                          caplog)
  try:
    # The restored checkpoint lacks the 6 items confirmed after it; Reverb
    # sent the 20 later ones again by itself. The watcher, woken by the
    # reconnect, sends exactly the 6 again.
    serve_process.wait_until(lambda: observer.num_resent_items == 6,
                             'the watcher to send 6 items again', 60)
    assert observer.num_lost_items == observer.num_lost_at_restart == 0
    assert manager.stats()['resent_items'] == 6
    manager.flush()  # The same restart is handled once.
    assert observer.num_resent_items == 6
  finally:
    manager.close()
  stored = _stored_fingerprints(_final_checkpoint(server))
  want = collections.Counter(testing.item_fingerprint(i)
                             for i in testing.expected_items(steps, 2))
  assert stored == want  # Every item once.


def test_a_restart_in_the_middle_of_a_resend(served, tmp_path, caplog,
                                             monkeypatch):
  restarts = []

  def restart_once(step):
    if step == 'resent' and not restarts:
      # Killed and started again after the first re-sent record: the rest
      # of the re-send waits for it, and the watcher sends again what the
      # third server lacks.
      restarts.append(server_box[0])
      server_box[0].stop(signal.SIGKILL)
      server_box[0] = served(checkpoint_dir=str(tmp_path / 'buffer'),
                             port=server_box[0].port)
  monkeypatch.setattr(resending, '_fault_point', restart_once)
  server_box = [None]
  original = serve_process.ServeProcess.__init__

  def remember(self, *args, **kwargs):
    original(self, *args, **kwargs)
    server_box[0] = self
  monkeypatch.setattr(serve_process.ServeProcess, '__init__', remember)
  _, manager, observer, steps = _restart_mid_episode(served, tmp_path, caplog)
  try:
    serve_process.wait_until(lambda: restarts and not observer.resender.pending
                             and observer.num_resent_items >= 6,
                             'the re-send that the second restart cut', 120)
    # The first re-send went on to the third server, but it asked the
    # second what it held: the 20 items Reverb had sent it by itself are
    # gone with it. The next check of the server (here the flush's) sees
    # the second restart and sends them too.
    manager.flush()
    assert observer.num_resent_items == 6 + 20
    assert observer.num_lost_items == 0
  finally:
    manager.close()
  stored = _stored_fingerprints(_final_checkpoint(server_box[0]))
  want = collections.Counter(testing.item_fingerprint(i)
                             for i in testing.expected_items(steps, 2))
  assert stored == want  # Every item once, whatever the second restart cut.


def test_eight_actors_write_through_a_server_kill(served, tmp_path):
  checkpoint_dir = str(tmp_path / 'buffer')
  server = served(checkpoint_dir=checkpoint_dir)
  results = serve_process.WORKERS.Queue()
  halfway = [serve_process.WORKERS.Event() for _ in range(8)]
  restarted = serve_process.WORKERS.Event()
  actors = [serve_process.start(remote_workers.resending_actor,
                                server.address, seed, 120, halfway[seed],
                                restarted, results) for seed in range(8)]
  for event in halfway:
    assert event.wait(240)
  manager, _ = remote_workers.client(server.address)
  try:
    manager.checkpoint()  # The checkpoint the restart resumes.
  finally:
    manager.close()
  server.stop(signal.SIGKILL)  # The actors write their second halves.
  server = served(checkpoint_dir=checkpoint_dir, port=server.port)
  restarted.set()
  reports = serve_process.get(results, 8)
  for process in actors:
    process.join(60)
    assert process.exitcode == 0
  want = collections.Counter()
  resent = 0
  for _, fingerprints, counters in reports:
    assert counters['lost_items'] == counters['lost_steps'] == 0, counters
    want.update(fingerprints)
    resent += counters['resent_items']
  assert resent > 0  # Some items were confirmed after the checkpoint.
  assert _stored_fingerprints(_final_checkpoint(server)) == want


def test_an_actor_killed_with_the_server_sends_its_journal_again(served,
                                                                   tmp_path):
  checkpoint_dir = str(tmp_path / 'buffer')
  journal_dir = str(tmp_path / 'actor_journal')
  server = served(checkpoint_dir=checkpoint_dir)
  results, go = serve_process.WORKERS.Queue(), serve_process.WORKERS.Event()
  actor = serve_process.start(remote_workers.journaled_actor, server.address,
                              journal_dir, 1, 60, go, results)
  (_, first, _), = serve_process.get(results, 1)
  manager, _ = remote_workers.client(server.address)
  try:
    manager.checkpoint()  # Holds the first steps' items only.
  finally:
    manager.close()
  go.set()
  (_, second, _), = serve_process.get(results, 1)  # Flushed: in its journal.
  remote_workers.kill(actor)  # Both machines lost: the actor...
  server.stop(signal.SIGKILL)  # ... and the server, after its checkpoint.
  server = served(checkpoint_dir=checkpoint_dir, port=server.port)
  # The actor, started again with its journal folder, takes its journal
  # over and sends what the server lacks (the second steps' items) before
  # its first step. (A queue and an event of their own: a process killed
  # while it held theirs leaves their locks taken.)
  results, go = serve_process.WORKERS.Queue(), serve_process.WORKERS.Event()
  actor = serve_process.start(remote_workers.journaled_actor, server.address,
                              journal_dir, 2, 30, go, results)
  (what, third, counters), = serve_process.get(results, 1)
  assert what == 'written', third  # Else the actor's traceback.
  remote_workers.kill(actor)
  assert counters['resent_items'] == len(second)
  assert counters['lost_items'] == 0
  assert _stored_fingerprints(_final_checkpoint(server)) == (
      collections.Counter(first + second + third))
