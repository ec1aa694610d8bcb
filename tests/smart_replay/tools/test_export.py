"""RLDS / npz export and import: content, boundaries, counts, round trip."""

import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

import smart_replay
from smart_replay.config import tables
from smart_replay.storage import reader as checkpoint_reader
from smart_replay.tools import export
from smart_replay.tools import rlds_io
from tests import testing


def _episodes(steps):
  """The recorded steps split into episodes (each ends at its boundary)."""
  episodes, episode = [], []
  for step in steps:
    episode.append(step)
    if step.is_boundary():
      episodes.append(episode)
      episode = []
  return episodes, episode


@pytest.fixture
def buffer(make_manager, tmp_path):
  manager = make_manager(capacity=1000)
  _, observer = manager.create_replay_buffer()
  record = testing.run_actor(observer, 150, seed=7)
  path = manager.checkpoint()
  return str(tmp_path / 'buffer'), path, record


def test_rlds_holds_every_stored_step_with_episode_boundaries(buffer,
                                                              tmp_path):
  source, path, record = buffer
  result = rlds_io.write_rlds(source, str(tmp_path / 'rlds'))
  episodes, unfinished = _episodes(record.steps)
  if len(unfinished) >= 2:
    episodes.append(unfinished)
  assert result.checkpoint == path
  assert result.steps == sum(len(e) for e in episodes)  # Every stored step.
  assert result.episodes == len(episodes)
  with open(tmp_path / 'rlds' / 'smart_replay_export.json') as f:
    info = json.load(f)
  assert info['steps'] == result.steps and info['items'] == result.items
  # A real TFDS dataset of RLDS episodes.
  read = list(tfds.builder_from_directory(str(tmp_path / 'rlds')).as_dataset(
      split='train'))
  assert len(read) == len(episodes)
  for got, want in zip(read, episodes):
    steps = next(iter(got['steps'].batch(10_000)))
    np.testing.assert_array_equal(
        steps['observation']['temperature'],
        np.stack([s.observation['temperature'] for s in want]))
    np.testing.assert_array_equal(steps['action'],
                                  np.stack([s.action for s in want]))
    np.testing.assert_array_equal(steps['reward'],
                                  np.stack([s.reward for s in want]))
    assert steps['is_first'].numpy().tolist() == [True] + [False] * (
        len(want) - 1)
    # RLDS's last step holds the final observation: TF-Agents' boundary.
    assert steps['is_last'].numpy().tolist() == [s.is_boundary()
                                                 for s in want]
    terminal = [s.is_boundary() and i > 0 and want[i - 1].discount == 0
                for i, s in enumerate(want)]
    assert steps['is_terminal'].numpy().tolist() == terminal


def test_round_trip_gives_identical_items(make_manager, tmp_path, data_spec):
  manager = make_manager(capacity=60, stride_length=1)
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 200, seed=2)  # Evicts: episodes start late.
  original = manager.checkpoint()
  rlds_io.write_rlds(str(tmp_path / 'buffer'), str(tmp_path / 'rlds'))
  imported = rlds_io.import_rlds(str(tmp_path / 'rlds'),
                                str(tmp_path / 'again'))
  def items(path):
    return [testing.item_fingerprint(checkpoint_reader.unflatten(
        data_spec, item.columns))
            for item in checkpoint_reader.CheckpointReader(path).items()]
  assert items(imported) == items(original)  # Same items, same order.
  assert len(items(original)) == 60
  loaded = smart_replay.ReplayBufferManager.from_checkpoint(imported)
  assert loaded.table_configs == manager.table_configs
  with pytest.raises(smart_replay.CheckpointExistsError):
    rlds_io.import_rlds(str(tmp_path / 'rlds'), str(tmp_path / 'again'))


def test_npz_transitions(buffer, tmp_path):
  source, _, record = buffer
  result = export.export_npz(source, str(tmp_path / 'out' / 't.npz'))
  data = np.load(tmp_path / 'out' / 't.npz')
  want = [(a, b) for a, b in zip(record.steps, record.steps[1:])
          if not a.is_boundary()]
  _, unfinished = _episodes(record.steps)
  if len(unfinished) < 2:  # No item holds an unfinished 1-step tail.
    want = want[:len(want) - max(len(unfinished) - 1, 0)]
  assert result.steps == len(data['reward']) == len(want) == result.items
  np.testing.assert_array_equal(data['reward'],
                                np.stack([a.reward for a, _ in want]))
  np.testing.assert_array_equal(
      data['next_observation/temperature'],
      np.stack([b.observation['temperature'] for _, b in want]))
  with pytest.raises(FileExistsError, match='overwrite'):
    export.export_npz(source, str(tmp_path / 'out' / 't.npz'))


def test_export_refuses_episode_tables_and_missing_buffers(
    make_manager, tmp_path):
  manager = make_manager(table_configs=[tables.TableConfig(
      name='episodes', kind='episode', episode_length=20)])
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 30)
  manager.checkpoint()
  with pytest.raises(ValueError, match=r"sequence tables \[\] \(of \['episodes'\]\)"):
    rlds_io.write_rlds(str(tmp_path / 'buffer'), str(tmp_path / 'rlds'))
  with pytest.raises(smart_replay.CheckpointNotFoundError):
    rlds_io.write_rlds(str(tmp_path / 'nowhere'), str(tmp_path / 'rlds'))


def test_export_checks_the_item_count_against_the_manifest(buffer, tmp_path):
  source, path, _ = buffer
  manifest_path = os.path.join(path, 'manifest.json')
  with open(manifest_path) as f:
    manifest = json.load(f)
  manifest['counts']['tables']['experience']['items'] += 1
  with open(manifest_path, 'w') as f:
    json.dump(manifest, f)
  with pytest.raises(smart_replay.CheckpointCorruptError,
                     match='manifest records'):
    rlds_io.write_rlds(source, str(tmp_path / 'rlds'))


def test_an_empty_buffer_exports_empty_npz_and_no_rlds(make_manager, tmp_path):
  manager = make_manager()
  manager.create_replay_buffer()
  manager.checkpoint()
  with pytest.raises(ValueError, match='holds no steps; an RLDS dataset '
                     'needs at least one episode'):
    rlds_io.write_rlds(str(tmp_path / 'buffer'), str(tmp_path / 'r'))
  assert not os.path.exists(tmp_path / 'r')
  export.export_npz(str(tmp_path / 'buffer'), str(tmp_path / 't.npz'))
  data = np.load(tmp_path / 't.npz')
  assert data['observation/temperature'].shape == (0, 3)


def test_import_refuses_tables_whose_items_leave_gaps(make_manager, tmp_path):
  manager = make_manager(table_configs=[tables.TableConfig(
      remover='uniform', max_times_sampled=2)])
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 40)
  manager.checkpoint()
  rlds_io.write_rlds(str(tmp_path / 'buffer'), str(tmp_path / 'rlds'))
  with pytest.raises(ValueError, match="remover 'uniform'.*max_times_sampled"):
    rlds_io.import_rlds(str(tmp_path / 'rlds'), str(tmp_path / 'again'))
  assert not os.path.exists(tmp_path / 'again')
