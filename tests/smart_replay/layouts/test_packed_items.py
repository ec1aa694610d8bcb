"""Packed items: blocks hold every window exactly once, and read back as such."""

import collections

import numpy as np
import pytest

from smart_replay.config import buffer as config_lib
from smart_replay.config import tables
from smart_replay.manager import facade as manager_lib
from smart_replay.tools import inspection
from smart_replay.tools import rlds_io
from smart_replay.layouts import packed_items
from tests.smart_replay.sampling import test_sampling_distribution as streams


class _Config:  # What BlockBuilder reads of a resolved TableConfig.
  def __init__(self, block_length, sequence_length, cross_episodes=False):
    self.name = 'blocks'
    self.block_length = block_length
    self.sequence_length = sequence_length
    self.cross_episodes = cross_episodes


def _block_windows(config, step_types, flush_at=()):
  """Windows (tuples of step indices) of the blocks a stream makes."""
  builder = packed_items.BlockBuilder(config, bytes_per_step=4)
  found = []
  def take(done):
    for rows, count in done:
      assert rows.shape == (config.block_length, 4)
      index = rows.view(np.int32)[:, 0]
      found.extend(tuple(index[s:s + config.sequence_length])
                   for s in range(count))
  for i, step_type in enumerate(step_types):
    take(builder.add(np.array([i], np.int32).view(np.uint8), step_type))
    if i in flush_at:
      take(builder.flush())
  take(builder.flush())
  return found


def _stream(lengths):
  step_types = []
  for length in lengths:
    step_types += [0] + [1] * (length - 2) + [2] if length > 1 else [0]
  return step_types


@pytest.mark.unit
@pytest.mark.parametrize('block_length, length', [(5, 2), (5, 3), (8, 1),
                                                  (4, 3)])
@pytest.mark.parametrize('cross', [False, True])
def test_every_window_is_in_exactly_one_block(block_length, length, cross):
  rng = np.random.default_rng(block_length * 10 + length)
  lengths = [int(n) for n in rng.integers(1, 14, size=40)]
  step_types = _stream(lengths)
  found = _block_windows(_Config(block_length, length, cross), step_types,
                         flush_at={17, 18, 60, 61, 62})
  if cross:
    episodes = [list(range(len(step_types)))]
  else:
    episodes, first = [], 0
    for n in lengths:
      episodes.append(list(range(first, first + n)))
      first += n
  expected = [tuple(e[s:s + length]) for e in episodes
              for s in range(len(e) - length + 1)]
  assert collections.Counter(found) == collections.Counter(expected)


@pytest.mark.unit
def test_block_tables_refuse_what_they_cannot_do(data_spec):
  with pytest.raises(ValueError, match=r"sampler is 'prioritized'; expected "
                     r"'uniform' for a table of packed items"):
    tables.TableConfig(block_length=8, sampler='prioritized')
  with pytest.raises(ValueError, match=r'block_length is 2; expected > '
                     r'sequence_length=2'):
    tables.TableConfig(block_length=2, sequence_length=2)
  with pytest.raises(ValueError, match=r'stride_length is 2; expected 1'):
    tables.TableConfig(block_length=8, stride_length=2)
  with pytest.raises(ValueError, match=r'windows_per_item is 0'):
    tables.TableConfig(windows_per_item=0)
  with pytest.raises(ValueError, match=r"block_length=8 needs "
                     r"layout='packed'.*got layout='columns'"):
    config_lib.BufferConfig.resolve(
        data_spec=data_spec, capacity=10, sequence_length=2, stride_length=1,
        table_configs=[tables.TableConfig(block_length=8)], layout='columns')


def _manager(tmp_path, name='buffer'):
  return manager_lib.ReplayBufferManager(
      streams._spec(), capacity=1000, checkpoint_dir=str(tmp_path / name),
      sequence_length=3, table_configs=[
          tables.TableConfig(name='windows'),
          tables.TableConfig(name='blocks', block_length=6)])


def _epoch_windows(manager, table):
  found = collections.Counter()
  for trajectory, keys in manager.epoch(batch_size=7, table_name=table,
                                        seed=0):
    assert trajectory.observation.shape[1:] == (3, 1)
    assert len(keys) == trajectory.observation.shape[0]
    found.update(tuple(w) for w in trajectory.observation[:, :, 0].tolist())
  return found


def test_blocks_hold_the_windows_of_a_per_window_table_and_survive_a_load(
    tmp_path):
  with _manager(tmp_path) as manager:
    _, observer = manager.create_replay_buffer()
    streams._write(observer)
    windows = _epoch_windows(manager, 'windows')
    assert _epoch_windows(manager, 'blocks') == windows
    assert sum(windows.values()) == len(streams._windows(3))
    stats = manager.stats()['tables']['blocks']
    assert stats['item_episodes'] is None
    assert (stats['block_length'], stats['windows_per_block'],
            stats['max_windows']) == (6, 4, 1000)
    assert stats['max_size'] == 250  # Blocks of 4 windows.
    with pytest.raises(ValueError, match='holds packed items'):
      manager.num_batches(8, table_name='blocks')
    manager.checkpoint()
  with _manager(tmp_path) as manager:
    manager.load_replay_buffer()
    assert manager.layout == 'packed'
    assert _epoch_windows(manager, 'blocks') == windows
    description = inspection.describe_checkpoints(manager.checkpoint_dir)
    assert description['layout'] == 'packed'
    assert description['tables']['blocks']['capacity'] == 250
    text = inspection.format_text(description)
    assert 'layout=packed' in text
    assert '/250 blocks (of 6 steps, up to 4 windows)' in text
    # Export reads the per-window table's steps, and names what it cannot.
    result = rlds_io.write_rlds(manager.checkpoint_dir,
                                str(tmp_path / 'rlds'))
    assert result.steps == sum(n for n in streams.LENGTHS if n >= 3)
    with pytest.raises(ValueError, match=r"packed items \(\['blocks'\]\)"):
      rlds_io.write_rlds(manager.checkpoint_dir, str(tmp_path / 'rlds2'),
                         table='blocks')
