"""Durability under faults, tested the way storage systems are tested.

A child process writes and checkpoints a buffer and is killed (`SIGKILL`) at
every named step of a commit and at random moments, 20 rounds each; after
each kill the buffer must load exactly the newest committed checkpoint and
checkpoint again. Two managers cannot open one buffer directory. A full or
read-only disk (a small tmpfs) fails a save with one error and loses nothing.
"""

import multiprocessing
import os
import random
import signal
import time

import pytest
import reverb

import smart_replay
from smart_replay.remote import replay_server as serve_lib
from smart_replay.storage import checkpoint_folders as checkpoints
from smart_replay.storage import store as checkpoint_store
from tests.smart_replay.storage import durability_worker as worker

ROUNDS = 20
FORKSERVER = multiprocessing.get_context('forkserver')
# The manager's modules load lazily (`smart_replay.__getattr__`): preloaded,
# each child skips importing (and, under Bazel, compiling) them again.
FORKSERVER.set_forkserver_preload(['tests.smart_replay.storage.durability_worker',
                                  'smart_replay.manager.facade'])
# A step reached in a commit from which recovery keeps the new checkpoint.
KEPT_FROM = checkpoint_store.COMMIT_STEPS.index('manifest_written')


def _start(target, *args):
  parent, child = FORKSERVER.Pipe()
  process = FORKSERVER.Process(target=target, args=args + (child,))
  process.start()
  child.close()
  return process, parent


def _receive(conn, process, timeout_s=120):
  """The child's next message; fails (does not hang) after `timeout_s`."""
  if not conn.poll(timeout_s):
    process.kill()
    raise AssertionError(f'no message from pid {process.pid} in {timeout_s} s '
                         f'(exit code {process.exitcode})')
  return conn.recv()


def _kill(process):
  process.kill()
  process.join(60)
  assert process.exitcode == -signal.SIGKILL, process.exitcode


def _new_buffer(buffer_dir):
  """An empty buffer with one committed (empty) checkpoint."""
  manager = worker.make_manager(buffer_dir)
  manager.create_replay_buffer()
  manager.checkpoint(extra={'round': None})
  manager.close()


def _load_check_and_save(buffer_dir, rounds, newest_round):
  """Loads, checks the content is exactly `rounds`, checkpoints again."""
  manager = worker.make_manager(buffer_dir)
  try:
    manager.load_replay_buffer()
    assert manager.loaded_manifest['extra']['round'] == newest_round
    assert worker.stored_first_steps(manager) == worker.expected_first_steps(
        rounds)
    path = manager.checkpoint(extra={'round': newest_round})
  finally:
    manager.close()
  assert checkpoints.verify(path)['extra']['round'] == newest_round
  leftovers = [n for n in os.listdir(os.path.dirname(path))
               if not checkpoints.checkpoint_number(n)]
  assert leftovers == []
  assert os.listdir(os.path.join(buffer_dir, checkpoints.REVERB_DIR)) == []
  orphaned = os.path.join(buffer_dir, checkpoints.ORPHANED_DIR)
  assert len(os.listdir(orphaned) if os.path.isdir(orphaned) else []) <= 2


@pytest.mark.parametrize('step', checkpoint_store.COMMIT_STEPS)
def test_kill_at_each_commit_step_loads_exactly_and_saves_again(tmp_path,
                                                                step):
  buffer_dir = str(tmp_path / 'buffer')
  _new_buffer(buffer_dir)
  rounds = []  # The rounds the newest committed checkpoint holds.
  for r in range(ROUNDS):
    process, conn = _start(worker.write_and_die_at, buffer_dir, r, step)
    assert _receive(conn, process) == ('saving', r)
    assert _receive(conn, process) == ('dying', step)
    process.join(60)
    assert process.exitcode == -signal.SIGKILL, process.exitcode
    if checkpoint_store.COMMIT_STEPS.index(step) >= KEPT_FROM:
      rounds.append(r)
    _load_check_and_save(buffer_dir, rounds, rounds[-1] if rounds else None)


def test_kill_at_random_moments_loads_exactly_and_saves_again(tmp_path):
  buffer_dir = str(tmp_path / 'buffer')
  _new_buffer(buffer_dir)
  rng = random.Random(14)
  rounds, next_round, round_s = [], 0, None
  for _ in range(ROUNDS):
    process, conn = _start(worker.write_until_killed, buffer_dir, next_round)
    first = _receive(conn, process)
    assert first[:2] == ('committed', next_round)
    reported = [next_round]
    if round_s is None:  # One round of writing and saving, the child warm
      # (not its start, which takes longer and would widen the window).
      began = time.monotonic()
      second = _receive(conn, process)
      assert second[:2] == ('committed', next_round + 1)
      round_s = time.monotonic() - began
      reported.append(next_round + 1)
    # A random moment within about two rounds of writing and saving.
    deadline = time.monotonic() + rng.uniform(0, 2 * round_s)
    while conn.poll(max(0.0, deadline - time.monotonic())):
      reported.append(conn.recv()[1])
    _kill(process)
    try:
      while conn.poll():  # Commits reported just before the kill.
        reported.append(conn.recv()[1])
    except EOFError:  # All read: the child's end is closed.
      pass
    manager = worker.make_manager(buffer_dir)
    manager.load_replay_buffer()
    loaded = manager.loaded_manifest['extra']['round']
    manager.close()
    # The last reported commit, or the one after it if the kill came between
    # the commit and its report.
    assert loaded in (reported[-1], reported[-1] + 1), (loaded, reported)
    rounds += list(range(next_round, loaded + 1))
    _load_check_and_save(buffer_dir, rounds, loaded)
    next_round = loaded + 2  # The round being written at the kill is lost.


def test_second_manager_of_a_directory_is_refused_in_process(make_manager,
                                                             tmp_path):
  first = make_manager(tmp_path / 'buffer')
  first.create_replay_buffer()
  first.checkpoint()
  second = make_manager(tmp_path / 'buffer')
  with pytest.raises(smart_replay.BufferInUseError) as e:
    second.load_replay_buffer()
  assert f'process {os.getpid()} on host' in str(e.value)
  assert 'another ReplayBufferManager of this process' in str(e.value)
  assert e.value.holder['pid'] == os.getpid()
  with pytest.raises(smart_replay.BufferInUseError):
    second.create_replay_buffer(overwrite=True)
  assert len(first.existing_checkpoints()) == 1  # Untouched.
  first.close()
  second.load_replay_buffer()  # Free once the first one closed.
  assert second.existing_checkpoints() == first.existing_checkpoints()


def test_second_process_is_refused_and_a_kill_leaves_no_stale_lock(tmp_path):
  buffer_dir = str(tmp_path / 'buffer')
  _new_buffer(buffer_dir)
  process, conn = _start(worker.hold_open, buffer_dir)
  assert _receive(conn, process) == ('open', process.pid)
  manager = worker.make_manager(buffer_dir)
  with pytest.raises(smart_replay.BufferInUseError,
                     match=f'open in process {process.pid} on host'):
    manager.load_replay_buffer()
  # Reading it as a starter buffer from another directory stays allowed.
  reader = worker.make_manager(str(tmp_path / 'reader'))
  reader.load_replay_buffer(buffer_dir)
  reader.close()
  _kill(process)
  manager.load_replay_buffer()  # The kernel released the lock at the kill.
  manager.close()


def test_py_client_checkpoint_is_the_managers(tmp_path):
  buffer_dir = str(tmp_path / 'buffer')
  manager, replay_buffer, _ = worker.new_buffer_with_round(buffer_dir)
  path = replay_buffer.py_client.checkpoint()  # The original tool's call.
  manager.close()
  assert checkpoints.checkpoint_number(path) == 1
  # Each episode's last step is a boundary: no environment step.
  assert checkpoints.verify(path)['counts']['env_steps'] == (
      worker.STEPS_PER_ROUND - worker.EPISODES_PER_ROUND)
  again = worker.make_manager(buffer_dir)
  again.load_replay_buffer()
  assert again.loaded_checkpoint == path
  assert worker.stored_first_steps(again) == worker.expected_first_steps([0])
  again.close()


def test_retention_keeps_the_good_checkpoint_not_the_damaged_one(
    make_manager, tmp_path):
  buffer_dir = str(tmp_path / 'buffer')
  manager = make_manager(buffer_dir, keep_checkpoints=2)
  manager.create_replay_buffer()
  good = manager.checkpoint()
  damaged = manager.checkpoint()
  manager.close()
  with open(os.path.join(damaged, 'chunks.tfrecord'), 'ab') as f:
    f.write(b'garbage')
  manager = make_manager(buffer_dir, keep_checkpoints=2)
  manager.load_replay_buffer()
  assert manager.loaded_checkpoint == good  # Fell back past the damage.
  newest = manager.checkpoint()
  manager.close()
  assert checkpoint_store.CheckpointStore(buffer_dir).checkpoints() == [
      good, newest]
  aside = os.path.join(buffer_dir, checkpoints.ORPHANED_DIR,
                       os.path.basename(damaged))
  assert os.path.isdir(aside)


def test_orphaned_keeps_only_the_newest_entries(tmp_path):
  store = checkpoint_store.CheckpointStore(str(tmp_path))
  for i in range(5):
    leftover = os.path.join(store.prepare_reverb_root(), f'2026-0{i}')
    os.makedirs(leftover)
    for name in ('tables.tfrecord', 'items.tfrecord', 'chunks.tfrecord',
                 'DONE'):
      open(os.path.join(leftover, name), 'w').close()
    store.recover()
  orphaned = sorted(os.listdir(tmp_path / checkpoints.ORPHANED_DIR))
  assert orphaned == ['2026-03', '2026-04']


def test_recover_removes_partial_saves_and_finishes_deletions(tmp_path):
  store = checkpoint_store.CheckpointStore(str(tmp_path))
  partial = os.path.join(store.prepare_reverb_root(), '2026-01')
  os.makedirs(partial)
  open(os.path.join(partial, 'chunks.tfrecord'), 'w').close()  # No DONE.
  incoming = os.path.join(store.checkpoints_dir, '.incoming-ckpt-000001')
  half_deleted = os.path.join(store.checkpoints_dir, '.deleting-ckpt-000007')
  for folder in (incoming, half_deleted):
    os.makedirs(folder)
    open(os.path.join(folder, 'items.tfrecord'), 'w').close()
  actions = store.recover()
  assert set(actions) == {f'removed {incoming}', f'removed {partial}'}
  assert os.listdir(store.checkpoints_dir) == []
  assert os.listdir(store.reverb_root) == []
  assert not os.path.exists(tmp_path / checkpoints.ORPHANED_DIR)


def test_a_plain_reverb_checkpoint_behind_the_managers_back_is_set_aside(
    tmp_path):
  buffer_dir = str(tmp_path / 'buffer')
  manager, _, _ = worker.new_buffer_with_round(buffer_dir)
  raw = reverb.Client(manager.server_address).checkpoint()  # Not ours.
  ours = manager.checkpoint()
  manager.close()
  assert os.path.isdir(os.path.join(buffer_dir, checkpoints.ORPHANED_DIR,
                                    os.path.basename(raw)))
  again = worker.make_manager(buffer_dir)
  again.load_replay_buffer()
  assert again.loaded_checkpoint == ours
  again.close()


def test_server_resumes_a_first_commit_that_a_kill_interrupted(tmp_path):
  buffer_dir = str(tmp_path / 'buffer')
  manager, _, _ = worker.new_buffer_with_round(buffer_dir)
  path = manager.checkpoint()
  manager.close()
  # What a kill right after the manifest was written leaves.
  os.replace(path, os.path.join(os.path.dirname(path), '.incoming-ckpt-000001'))
  server = serve_lib.ReplayServer(worker.make_manager(buffer_dir),
                                  log_every_s=3600)
  server.start()
  try:
    assert server.last_checkpoint == path
    assert server.manager.num_frames() == 8
  finally:
    server.close(final_checkpoint=False)
