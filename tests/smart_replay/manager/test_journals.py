"""An in-process buffer's write-ahead journal (`manager.journals`), tested
the way storage systems are: a process that writes, flushes and checkpoints
is killed (`SIGKILL`) at each named step of its journal (records written,
fsynced, a segment dropped after a checkpoint, a record replayed at a load),
20 rounds each; every load then holds exactly the rounds it flushed (or the
one it was flushing), each item once.
"""

import multiprocessing
import os
import random
import signal
import time

import numpy as np
import pytest
import tree

import smart_replay
from smart_replay.manager import journals as journals_lib
from smart_replay.storage import journal_segments
from smart_replay.writing import journaling
from tests.smart_replay.manager import journal_worker
from tests.smart_replay.storage import durability_worker as rounds

ROUNDS = 20
FORKSERVER = multiprocessing.get_context('forkserver')
# The manager's modules load lazily (`smart_replay.__getattr__`): preloaded,
# each child skips importing (and, under Bazel, compiling) them again.
FORKSERVER.set_forkserver_preload(['tests.smart_replay.manager.journal_worker',
                                  'smart_replay.manager.facade'])


def _new_buffer(buffer_dir):
  """A buffer holding round 0, checkpointed."""
  manager = journal_worker.make_manager(buffer_dir)
  _, observer = manager.create_replay_buffer()
  rounds.write_round(observer, 0)
  manager.checkpoint(extra={'round': 0})
  manager.close()


def _rounds_held(stored, low, high):
  """The n in low..high such that `stored` is exactly rounds 0..n."""
  for last in range(low, high + 1):
    if stored == rounds.expected_first_steps(range(last + 1)):
      return last
  raise AssertionError(
      f'the buffer holds {len(stored)} items, not exactly rounds 0..n for n '
      f'in {low}..{high} (each item once): first steps {stored[-12:]}')


def _receive(conn, process, timeout_s=120):
  if not conn.poll(timeout_s):
    process.kill()
    raise AssertionError(f'no message from pid {process.pid} in {timeout_s} s')
  return conn.recv()


@pytest.mark.parametrize('step', journal_worker.STEPS)
def test_a_kill_at_each_journal_step_keeps_every_flushed_step_once(tmp_path,
                                                                   step):
  buffer_dir = str(tmp_path / 'buffer')
  _new_buffer(buffer_dir)
  rng = random.Random(f'journal {step}')
  low = high = 0  # The rounds a load may hold: 0..low at least, ..high.
  kills = 0
  for _ in range(ROUNDS):
    parent, child = FORKSERVER.Pipe()
    process = FORKSERVER.Process(
        target=journal_worker.write_until_killed,
        args=(buffer_dir, step, rng.randrange(1, 5), child))
    process.start()
    child.close()
    flushed = None
    try:
      while True:
        kind, value = _receive(parent, process)
        if kind == 'loaded':
          flushed = low = high = _rounds_held(value, low, high)
        elif kind == 'flushed':
          flushed = value
          if value >= low + 3:
            break  # The step did not come: a kill at a random point.
        elif kind == 'dying':
          kills += 1
          break
    except EOFError:  # Killed before all was read.
      pass
    process.kill()
    process.join(60)
    assert process.exitcode == -signal.SIGKILL, process.exitcode
    if flushed is not None:
      low, high = flushed, flushed + 1
  assert kills >= ROUNDS // 2, f'{step} was reached in {kills} rounds only'
  # A last load holds the same, checkpoints it, and the journals it replayed
  # are then covered and deleted.
  manager = journal_worker.make_manager(buffer_dir)
  _, observer = manager.load_replay_buffer()
  held = _rounds_held(rounds.stored_first_steps(manager), low, high)
  manager.checkpoint(extra={'round': held})
  mine = observer.journal.writer_id
  manager.close()
  folder = os.path.join(buffer_dir, 'journal')
  assert list(journal_segments.segments(folder)) == [mine]
  assert all(r.kind == journaling.FLUSH
             for r in journal_segments.read(folder, mine).records)


def test_a_journal_written_before_its_checkpoint_is_not_replayed_twice(
    tmp_path):
  """Two loads in a row without a checkpoint replay the same records from
  the same marks: each item once."""
  buffer_dir = str(tmp_path / 'buffer')
  _new_buffer(buffer_dir)
  manager = journal_worker.make_manager(buffer_dir)
  _, observer = manager.load_replay_buffer()
  rounds.write_round(observer, 1)
  manager.close()  # No checkpoint: round 1 is only in the journal.
  for _ in range(2):
    manager = journal_worker.make_manager(buffer_dir)
    manager.load_replay_buffer()
    assert _rounds_held(rounds.stored_first_steps(manager), 1, 1) == 1
    journal = manager.stats()['journal']
    # Round 1's 10 steps (8 items), its flush and the flush at close().
    assert journal['replayed'] == {'writers': 1, 'records': 12, 'items': 8}
    assert journal['sync'] == 'always' and journal['writers'] == 1
    assert journal['bytes'] > 0 and journal['failures'] == 0
    manager.close()


def test_the_default_journal_keeps_what_was_written_a_second_before_a_kill(
    tmp_path):
  """'every_second', no flush at all: after `kill -9`, every round written
  more than 1 s before the kill is back, and nothing is stored twice."""
  buffer_dir = str(tmp_path / 'buffer')
  _new_buffer(buffer_dir)
  parent, child = FORKSERVER.Pipe()
  process = FORKSERVER.Process(target=journal_worker.write_without_flushing,
                               args=(buffer_dir, child))
  process.start()
  child.close()
  written = []  # (round, when its last step was written)
  while not written or written[-1][1] - written[0][1] < 3:
    kind, round_index, when = _receive(parent, process)
    assert kind == 'written'
    written.append((round_index, when))
  killed_at = time.monotonic()
  process.kill()
  process.join(60)
  assert process.exitcode == -signal.SIGKILL
  manager = journal_worker.make_manager(buffer_dir)
  manager.load_replay_buffer()
  stored = rounds.stored_first_steps(manager)
  manager.close()
  assert len(stored) == len(set(stored))  # Each item once.
  durable = [r for r, when in written if when < killed_at - 1.0]
  assert durable, written
  assert set(rounds.expected_first_steps(range(durable[-1] + 1))) <= set(
      stored)
  started = written[-1][0] + 1  # The round being written at the kill.
  assert set(stored) <= set(rounds.expected_first_steps(range(started + 1)))


def _wait_until(condition, timeout_s, what):
  """Waits (polling) until `condition()`; fails naming `what` after
  `timeout_s`."""
  deadline = time.monotonic() + timeout_s
  while not condition():
    if time.monotonic() > deadline:
      raise AssertionError(f'{what} did not happen within {timeout_s} s')
    time.sleep(0.05)


def test_a_buffer_never_checkpointed_keeps_a_journal_of_about_its_capacity(
    tmp_path, monkeypatch):
  """Past its capacity (at least `MIN_BOUND_STEPS`, lowered here from 10,000
  to 1,000 steps: the bound scales, the behaviour does not change) above the
  last checkpoint, the manager checkpoints on its own (kept beside the
  user's, which survives retention); the journal stays about that long, and
  a load holds what the buffer held."""
  monkeypatch.setattr(journals_lib, 'MIN_BOUND_STEPS', 1_000)
  buffer_dir = str(tmp_path / 'buffer')
  capacity = 40  # Items; a round of 10 steps makes 8.
  bound = journals_lib.MIN_BOUND_STEPS  # Records: one per step, or flush.
  every = bound // 100  # Rounds between two samples of the journal's size.
  manager = rounds.make_manager(buffer_dir, capacity=capacity,
                                journal='off', keep_checkpoints=1)
  _, observer = manager.create_replay_buffer()
  rounds.write_round(observer, 0)
  mine = manager.checkpoint(extra={'train_step': 0})
  sizes = []
  for r in range(1, 3 * bound // 11 + every):  # 11 records a round.
    rounds.write_round(observer, r)
    if r % every == 0:
      _wait_until(lambda: manager.stats()['journal'][
          'records_since_checkpoint'] <= bound, 30, 'an automatic checkpoint')
      sizes.append(manager.stats()['journal']['bytes'])
  _wait_until(lambda: manager.stats()['journal']['automatic_checkpoints'] >= 3,
              60, 'three automatic checkpoints')
  assert mine in manager.existing_checkpoints()  # Never displaced.
  assert len(manager.existing_checkpoints()) == 2  # Mine, the newest automatic.
  # Bounded: never more than about twice the bound's records on disk (a
  # segment is dropped once the checkpoint after next no longer needs its
  # steps as context), of three times the bound written; the first sample
  # holds `11 * every` records (11 % of the bound).
  per_record = sizes[0] / (11 * every)
  assert max(sizes) < per_record * 2.25 * bound, (sizes, per_record)
  assert any(b < a for a, b in zip(sizes, sizes[1:])), sizes  # Dropped.
  held = rounds.stored_first_steps(manager)
  assert len(held) == capacity
  manager.close()
  manager = rounds.make_manager(buffer_dir, capacity=capacity,
                                journal='off', keep_checkpoints=1)
  manager.load_replay_buffer()
  assert manager.loaded_manifest['extra'] == {  # Mine, carried forward.
      'train_step': 0, 'automatic_checkpoint': True}
  assert rounds.stored_first_steps(manager) == held
  manager.close()


def test_the_default_journals_small_steps_and_frame_cells_not_whole_stacks(
    tmp_path):
  """'auto': 'every_second' for small steps and for a frame-stacked buffer
  (its records hold cells: new frames, compressed); none where records would
  hold each step's whole stack uncompressed (a frame stack with packed
  items, 7 KB a step here) unless asked for by name, or unless the folder
  already holds a journal."""
  from tests import testing  # pylint: disable=g-import-not-at-top
  small = rounds.make_manager(str(tmp_path / 'small'), journal='auto')
  small.create_replay_buffer()
  assert small.stats()['journal']['sync'] == 'every_second'
  small.close()
  frames = testing.frame_spec([4, 42, 42])  # 7 KB a step.
  cells = smart_replay.ReplayBufferManager(
      frames, capacity=100, checkpoint_dir=str(tmp_path / 'cells'),
      sequence_length=2)
  cells.create_replay_buffer()
  assert cells.stats()['journal']['sync'] == 'every_second'
  cells.close()
  stacked = str(tmp_path / 'stacked')
  blocks = [smart_replay.TableConfig(block_length=8)]
  manager = smart_replay.ReplayBufferManager(
      frames, capacity=100, checkpoint_dir=stacked, sequence_length=2,
      table_configs=blocks)
  _, observer = manager.create_replay_buffer()
  assert 'journal' not in manager.stats()
  manager.close()
  assert not os.path.exists(os.path.join(stacked, 'journal'))
  manager = smart_replay.ReplayBufferManager(
      frames, capacity=100, checkpoint_dir=stacked, sequence_length=2,
      table_configs=blocks, journal='every_second')
  _, observer = manager.create_replay_buffer(overwrite=True)
  manager.checkpoint()
  for step in testing.frame_stream(5, depth=4):
    observer(tree.map_structure(
        lambda x: np.resize(x, (4, 42, 42)) if x.ndim == 3 else x, step))
  observer.flush()
  assert manager.stats()['journal']['sync'] == 'every_second'
  manager.close()
  manager = smart_replay.ReplayBufferManager(  # 'auto' keeps the journal.
      frames, capacity=100, checkpoint_dir=stacked, sequence_length=2,
      table_configs=blocks)
  manager.load_replay_buffer()
  assert manager.stats()['journal']['sync'] == 'every_second'
  manager.close()
