"""Replaying an observer's journal (`writing.journaling`) makes the items the
observer made, whatever the tables, layout and batching: a buffer copied
right after a flush (its checkpoint plus its journal: what a crash leaves)
and loaded holds, table by table, exactly the items the live buffer saves
in its next checkpoint, each once.
"""

import collections
import os
import shutil

import numpy as np
import pytest
from tf_agents.environments import batched_py_environment
from tf_agents.policies import random_py_policy
import tree

import smart_replay
from smart_replay import TableConfig
from smart_replay.storage import reader as reader_lib
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
