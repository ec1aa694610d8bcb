"""Replaying an observer's journal (`writing.journaling`) makes the items the
observer made, whatever the tables, layout and batching: a buffer copied
right after a flush (its checkpoint plus its journal: what a crash leaves)
and loaded holds, table by table, exactly the items the live buffer saves
in its next checkpoint, each once.
"""

import collections
import os
import shutil
import struct

import numpy as np
import pytest
from tf_agents.environments import batched_py_environment
from tf_agents.policies import random_py_policy
import tree

import smart_replay
from smart_replay import TableConfig
from smart_replay.storage import reader as reader_lib
from smart_replay.writing import journaling
from tests import testing

# Every kind of table: windows (strided, crossing episodes), episodes,
# prioritized, and packed items (blocks).
_TABLES = [
    TableConfig(name='windows'),
    TableConfig(name='strided', stride_length=2),
    TableConfig(name='episodes', kind='episode', episode_length=16),
    TableConfig(name='crossing', cross_episodes=True),
    TableConfig(name='prioritized', sampler='prioritized'),
    TableConfig(name='blocks', block_length=8),
]


def _run(observer, steps, seed, num_envs):
  """A real Actor's steps, of one environment or a batch of them."""
  if num_envs is None:
    testing.run_actor(observer, steps, seed=seed)
    return
  envs = [testing.make_env(seed=seed + i, max_duration=3 + 4 * i)
          for i in range(num_envs)]
  policy = random_py_policy.RandomPyPolicy(
      envs[0].time_step_spec(), envs[0].action_spec(),
      info_spec=testing.INFO_SPEC, outer_dims=(num_envs,), seed=seed)
  testing.run_actor(observer, steps, seed=seed, policy=policy,
                    env=batched_py_environment.BatchedPyEnvironment(envs))


def _items(checkpoint):
  """{table: Counter of item fingerprints} of a checkpoint."""
  found = collections.defaultdict(collections.Counter)
  for item in reader_lib.CheckpointReader(checkpoint).items():
    found[item.table][testing.item_fingerprint(item.columns)] += 1
  return dict(found)


def _write_frames(observer, steps, seed, num_envs=None):
  """Frame-stacked steps (each stack shares all but one frame with the
  one before, as an Atari wrapper's), of `num_envs` streams if given."""
  streams = [testing.frame_stream(steps, seed=seed + k)
             for k in range(num_envs or 1)]
  for batch in zip(*streams):
    observer(batch[0] if num_envs is None else tree.map_structure(
        lambda *xs: np.stack(xs), *batch))


@pytest.mark.parametrize('layout, num_envs, frames', [
    ('packed', None, False), ('columns', None, False), ('packed', 2, False),
    ('packed', None, True), ('packed', 2, 'cells only')])
def test_a_replayed_journal_makes_the_items_the_observer_made(
    tmp_path, layout, num_envs, frames):
  live_dir, crashed_dir = str(tmp_path / 'live'), str(tmp_path / 'crashed')
  tables = [t for t in _TABLES  # Packed items need packed steps.
            if layout == 'packed' or t.block_length is None]
  if frames == 'cells only':  # No packed items: records hold cells alone.
    tables = [t for t in tables if t.block_length is None]
  kwargs = dict(capacity=10_000, sequence_length=3, table_configs=tables,
                layout=layout, num_envs=num_envs, journal='always')
  if frames:  # Stacks stored once, in zstd cells.
    kwargs.update(data_spec=testing.frame_spec([3, 6, 5]),
                  frame_stack=smart_replay.FrameStack('observation', 0))
    write = lambda observer, steps, seed: _write_frames(
        observer, steps, seed, num_envs)
  else:
    kwargs.update(data_spec=testing.collect_data_spec(testing.make_env()))
    write = lambda observer, steps, seed: _run(observer, steps, seed, num_envs)
  live = smart_replay.ReplayBufferManager(checkpoint_dir=live_dir, **kwargs)
  _, observer = live.create_replay_buffer()
  write(observer, 60, 1)
  live.checkpoint()
  write(observer, 70, 2)  # Mid-episode at the end.
  observer.flush()
  shutil.copytree(live_dir, crashed_dir)  # What a kill -9 now leaves.
  expected = _items(live.checkpoint())
  live.close()
  assert sum(sum(c.values()) for c in expected.values()) > 100
  os.unlink(os.path.join(crashed_dir, '.lock'))
  recovered = smart_replay.ReplayBufferManager(checkpoint_dir=crashed_dir,
                                               **kwargs)
  recovered.load_replay_buffer()
  got = _items(recovered.checkpoint())
  recovered.close()
  assert got == expected


def test_a_frame_stacked_journal_holds_cells_not_stacks(tmp_path):
  # Without packed items, a record holds the step's cell (its new frame,
  # compressed), not its whole stack.
  spec = testing.frame_spec([4, 42, 42])  # 7 KB a stack.
  manager = smart_replay.ReplayBufferManager(
      spec, capacity=1000, sequence_length=2, checkpoint_dir=str(tmp_path),
      journal='always',
      frame_stack=smart_replay.FrameStack('observation', 0))
  _, observer = manager.create_replay_buffer()
  try:
    steps = testing.frame_stream(40, depth=4, frame_shape=(42, 42))
    for step in steps:
      observer(step)
    observer.flush()
    size = observer.journal.stats()['bytes']
  finally:
    manager.close()
  # A whole stack where an episode starts, one new frame at each other step
  # (random frames do not compress), not four frames at every step.
  starts = sum(1 for s in steps if int(s.step_type) == 0)
  frame = 42 * 42
  assert size < (4 * starts + len(steps)) * frame + len(steps) * 200
  assert size < len(steps) * 4 * frame / 2


class _Journal:
  """What a `CallLog` uses of a journal: the records it appends, kept."""

  def __init__(self):
    self.next_seq, self.records = 1, []

  def append(self, kind, payload):
    self.records.append((self.next_seq, kind, bytes(payload)))
    self.next_seq += 1
    return self.next_seq - 1


class _Counters:

  def __init__(self, steps, env_steps, episodes):
    self.steps, self.env_steps, self.episodes = steps, env_steps, episodes


@pytest.mark.unit
def test_a_call_record_has_the_documented_layout():
  """A call's record, built in one buffer, is the format journals on disk
  hold: header `<BBHIII`, columns, step types, ops `<BHHdI`."""
  journal = _Journal()
  log = journaling.CallLog(journal, tables=['a', 'b'], keep_alive=3,
                           num_streams=2, step_types=True)
  columns = [np.arange(4, dtype=np.float32).reshape(2, 2),
             np.array([5, 6], np.int64)]
  assert log.commit(_Counters(0, 0, 0)) is None  # No call yet: nothing.
  log.begin(columns, np.array([0, 1]), _Counters(3, 2, 1))
  log.appended(0)
  log.op(journaling.DEFER, 1, 'b', 0.5, 2)
  log.plain_op(journaling.END_CHUNK, 1)
  log.op(journaling.BLOCK_ADD)
  assert log.commit(_Counters(5, 4, 1)) == 1
  op = struct.Struct('<BHHdI')
  expected = b''.join([
      struct.pack('<BBHIII', journaling.FORMAT, 2, 4, 2, 2, 0),
      columns[0].tobytes(), columns[1].tobytes(), bytes([0, 1]),
      op.pack(journaling.APPEND, 0, 0, 0.0, 0),
      op.pack(journaling.DEFER, 1, 1, 0.5, 2),
      op.pack(journaling.END_CHUNK, 1, 0, 0.0, 0),
      op.pack(journaling.BLOCK_ADD, 0, 0, 0.0, 0)])
  assert journal.records == [(1, journaling.CALL, expected)]
  call = journaling.decode(expected, journaling.describe_columns(columns))
  assert [c.tolist() for c in call.columns] == [c.tolist() for c in columns]
  assert call.step_types.tolist() == [0, 1] and call.counted == (2, 2, 0)
  assert call.ops[1] == (journaling.DEFER, 1, 1, 0.5, 2)
  assert log.keep_from() == 1  # Stream 0's history holds call 1's step.
  log.begin([], [], _Counters(5, 4, 1))  # An end of episode doing nothing.
  assert log.commit(_Counters(5, 4, 1)) is None and journal.next_seq == 2


@pytest.mark.unit
def test_a_cells_record_puts_its_cells_after_the_header():
  journal = _Journal()
  log = journaling.CallLog(journal, tables=['a'], keep_alive=3,
                           num_streams=1, step_types=False, cells=True)
  log.begin([np.zeros(3, np.uint8)], 0, _Counters(0, 0, 0))
  log.appended_cells(0, [[np.array(b'xyz', object)],
                         [np.array(b'q', object)]])
  log.op(journaling.DEFER, 0, 'a', 1.0, 1)
  log.commit(_Counters(1, 1, 0))
  (_, _, payload), = journal.records
  assert payload[:struct.calcsize('<BBHIII')] == struct.pack(
      '<BBHIII', journaling.FORMAT_CELLS, 0, 2, 1, 1, 0)
  call = journaling.decode(payload, [])
  assert call.cells == [b'xyz', b'q'] and call.columns == []
  assert [o[0] for o in call.ops] == [journaling.APPEND_CELLS,
                                      journaling.DEFER]
  assert call.ops[0][4] == 2  # Its cells' count.
