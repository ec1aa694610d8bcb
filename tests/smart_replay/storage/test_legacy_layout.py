"""Buffers saved before storage layouts existed still load (issue 16).

`tests/fixtures/columns_layout_v1/` was written by the release before issue
16 (one Reverb column per field, no 'layout' key in its manifest) with
`tests/fixtures/make_columns_layout_v1.py`, whose spec and formula these
tests recompute every stored value from. Each test works on a copy of the
fixture (loading writes a lock file, and saving a new checkpoint), with a
real Reverb server.
"""

import os
import shutil
from typing import Any, Dict, Tuple

import numpy as np
import pytest
import tensorflow as tf
import tree

import smart_replay
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import reader as checkpoint_reader
from tests.fixtures import make_columns_layout_v1 as fixture

# A third episode, written after loading (same formula, episode index 2).
_MORE_LENGTHS = fixture.EPISODE_LENGTHS + (9,)


def _manifest(buffer_dir: str, checkpoint: str = fixture.CHECKPOINT) -> dict:
  """Reads the manifest of one checkpoint of a buffer directory.

  Args:
    buffer_dir: the buffer directory.
    checkpoint: the checkpoint folder, relative to `buffer_dir`.

  Returns:
    The manifest dict.
  """
  return manifest_lib.read(os.path.join(buffer_dir, checkpoint,
                                        manifest_lib.MANIFEST_NAME))


def _assert_same(actual: Any, expected: Any, where: str) -> None:
  """Asserts two nests hold the same leaves: dtype, shape and exact values.

  Args:
    actual: a nest of numpy arrays (a stored or sampled item).
    expected: the nest the fixture's formula gives.
    where: names the item in the failure message.
  """
  tree.assert_same_structure(actual, expected)
  for (path, got), want in zip(tree.flatten_with_path(actual),
                               tree.flatten(expected)):
    path = '/'.join(str(p) for p in path)
    got = np.asarray(got)
    assert got.dtype == want.dtype, (where, path, got.dtype, want.dtype)
    assert got.shape == want.shape, (where, path, got.shape, want.shape)
    np.testing.assert_array_equal(got, want, err_msg=f'{where} {path}')


def _item_id(trajectory: Any) -> Tuple[int, int]:
  """`(episode, first step)` of an item, from its first observation.

  Args:
    trajectory: an item's nest, leaves `[steps, ...]`.

  Returns:
    What `fixture.locate` reads from the first step's observation.
  """
  return fixture.locate(np.asarray(trajectory.observation)[0])


def _expected_priority(table_config: dict, item_id: Tuple[int, int]) -> float:
  """The priority a prioritized fixture item has in the checkpoint.

  Args:
    table_config: the prioritized table's entry of the manifest.
    item_id: `(episode, first step)` of the item.

  Returns:
    `priority + priority_epsilon` for the items `update_priorities` set (as
    `Priorities.update` computes it, in float64), else the initial 1.0.
  """
  value = fixture.priority(*item_id)
  if value is None:
    return fixture.INITIAL_PRIORITY
  return float(np.abs(np.float64(value)) +
               np.float64(table_config['priority_epsilon']))


def _table_config(manifest: dict, name: str) -> dict:
  """The manifest entry of table `name`.

  Args:
    manifest: a checkpoint's manifest.
    name: a table name.

  Returns:
    The table's `TableConfig.to_dict()` as stored.
  """
  return next(t for t in manifest['tables'] if t['name'] == name)


@pytest.fixture
def legacy_dir(tmp_path) -> str:
  """A copy of the legacy fixture's buffer directory.

  Args:
    tmp_path: pytest's temporary directory.

  Returns:
    The copy's path.
  """
  copy = str(tmp_path / fixture.FIXTURE_NAME)
  shutil.copytree(fixture.FIXTURE_DIR, copy)
  return copy


@pytest.fixture
def loaded(legacy_dir):
  """A manager configured from the legacy checkpoint and loaded from it.

  Args:
    legacy_dir: the copy of the fixture.

  Yields:
    The started `ReplayBufferManager`; closed after the test.
  """
  # The committed fixture outlives dependency upgrades; what is tested here
  # is its layout, not the package versions it was written with.
  manager = smart_replay.ReplayBufferManager.from_checkpoint(
      legacy_dir, sample_timeout_s=10.0, write_timeout_s=10.0,
      allow_version_mismatch=True)
  try:
    manager.load_replay_buffer()
    yield manager
  finally:
    manager.close()


def test_the_fixture_is_a_legacy_columns_checkpoint():
  """The committed fixture is what this file tests: pre-layout, complete.

  No 'layout' key in its manifest, one checkpoint of the expected files, and
  counts that match the formula.
  """
  manifest = _manifest(fixture.FIXTURE_DIR)
  assert 'layout' not in manifest
  assert manifest['extra']['fixture'] == fixture.FIXTURE_NAME
  assert sorted(os.listdir(os.path.join(fixture.FIXTURE_DIR,
                                        fixture.CHECKPOINT))) == sorted(
                                            fixture.CHECKPOINT_FILES)
  for table in fixture.TABLES:
    assert manifest['counts']['tables'][table]['items'] == len(
        fixture.expected_items(table))
  assert manifest['counts']['env_steps'] == sum(fixture.EPISODE_LENGTHS)


def test_loads_with_the_manifest_counts(loaded, legacy_dir):
  """(a) `from_checkpoint` + `load_replay_buffer` restore every table.

  Args:
    loaded: the manager loaded from the copy.
    legacy_dir: the copy of the fixture.
  """
  manifest = _manifest(legacy_dir)
  assert loaded.loaded_checkpoint == os.path.join(legacy_dir,
                                                  fixture.CHECKPOINT)
  assert loaded.loaded_manifest['extra'] == manifest['extra']
  assert [t.name for t in loaded.table_configs] == list(fixture.TABLES)
  tf.nest.assert_same_structure(loaded.data_spec, fixture.data_spec())
  assert loaded.data_spec == fixture.data_spec()
  stats = loaded.stats()
  for name, counts in manifest['counts']['tables'].items():
    assert stats['tables'][name]['items'] == counts['items'], name
  assert loaded.num_frames() == manifest['counts']['tables']['uniform'][
      'items']
  assert stats['env_steps'] == manifest['counts']['env_steps']
  assert stats['episodes'] == manifest['counts']['episodes']


def test_stored_items_equal_the_formula(legacy_dir):
  """(b, c) The checkpoint files hold exactly the formula's items.

  Read without a server by `CheckpointReader`: every item once, each field
  with its dtype and exact values, steps in order, and the priorities
  `update_priorities` gave (the others 1.0).

  Args:
    legacy_dir: the copy of the fixture.
  """
  manifest = _manifest(legacy_dir)
  reader = checkpoint_reader.CheckpointReader(
      os.path.join(legacy_dir, fixture.CHECKPOINT))
  assert reader.tables() == {name: c['items'] for name, c in
                             manifest['counts']['tables'].items()}
  spec = fixture.data_spec()
  for table in fixture.TABLES:
    want = fixture.expected_items(table)
    seen = {}
    for item in reader.items(table):
      trajectory = checkpoint_reader.unflatten(spec, item.columns)
      item_id = _item_id(trajectory)
      assert item_id not in seen, (table, item_id)
      seen[item_id] = item.key
      _assert_same(trajectory, want[item_id], f'{table} item {item_id}')
      num_steps = fixture.TABLES[table][1]
      assert [index for _, index in item.steps] == list(
          range(item_id[1], item_id[1] + num_steps))
      assert item.times_sampled == 0
      if table == fixture.PRIORITIZED_TABLE:
        assert item.priority == _expected_priority(
            _table_config(manifest, table), item_id), (table, item_id)
      else:
        assert item.priority == 1.0
    assert set(seen) == set(want), table


def _sample_every_item(manager, table: str, keys: Dict[int, Any],
                       max_batches: int = 200) -> Dict[int, list]:
  """Samples `table` until every key in `keys` was seen.

  Args:
    manager: a started manager.
    table: the table to sample.
    keys: the table's item keys (the values are not used).
    max_batches: gives up after this many batches.

  Returns:
    `{key: [(trajectory, priority), ...]}`: every sample of each key, the
    trajectory as a nest of numpy arrays `[steps, ...]` and the priority
    Reverb reported with it.
  """
  samples = {}
  dataset = manager.get_dataset(batch_size=16, table_name=table,
                                sample_timeout_s=10.0)
  for index, (trajectory, info) in enumerate(dataset):
    batch_keys = info.key[:, 0].numpy()
    priorities = info.priority[:, 0].numpy()
    for b, key in enumerate(batch_keys):
      sample = tf.nest.map_structure(lambda t: t[b].numpy(), trajectory)  # pylint: disable=cell-var-from-loop
      samples.setdefault(int(key), []).append((sample, float(priorities[b])))
    if set(keys) <= set(samples) or index + 1 >= max_batches:
      break
  return samples


def test_sampled_items_equal_the_formula_and_keep_priorities(loaded,
                                                             legacy_dir):
  """(b, c) Sampling the loaded buffer gives the formula's items.

  Every item of each table is sampled at least once; each sample equals the
  formula's item (dtypes and exact values), its key is the key the
  checkpoint stored for that item, and the prioritized table reports the
  stored priorities.

  Args:
    loaded: the manager loaded from the copy.
    legacy_dir: the copy of the fixture.
  """
  manifest = _manifest(legacy_dir)
  reader = checkpoint_reader.CheckpointReader(
      os.path.join(legacy_dir, fixture.CHECKPOINT))
  spec = fixture.data_spec()
  for table in fixture.TABLES:
    want = fixture.expected_items(table)
    stored = {item.key: _item_id(checkpoint_reader.unflatten(spec,
                                                             item.columns))
              for item in reader.items(table)}
    samples = _sample_every_item(loaded, table, stored)
    assert set(samples) == set(stored), table
    for key, drawn in samples.items():
      for trajectory, priority in drawn:
        item_id = _item_id(trajectory)
        assert item_id == stored[key], (table, key)
        _assert_same(trajectory, want[item_id],
                     f'{table} sampled item {item_id}')
        if table == fixture.PRIORITIZED_TABLE:
          assert priority == _expected_priority(
              _table_config(manifest, table), item_id), (table, item_id)
        else:
          assert priority == 1.0
  assert loaded.stats()['tables'][fixture.PRIORITIZED_TABLE][
      'max_priority'] == manifest['counts']['tables'][
          fixture.PRIORITIZED_TABLE]['max_priority']


def test_layout_is_columns(loaded):
  """(d) A manifest without a 'layout' key means one column per field.

  Args:
    loaded: the manager loaded from the copy.
  """
  assert loaded.layout == 'columns'


def test_writes_and_checkpoints_after_load_as_columns(loaded, legacy_dir):
  """(e) Writing after the load, then saving, keeps the 'columns' layout.

  A third episode goes through the loaded buffer's observer; the new
  checkpoint records layout 'columns', holds the old and the new items
  (all equal to the formula), keeps the old priorities, and gives the new
  prioritized items the largest priority restored from the old manifest.

  Args:
    loaded: the manager loaded from the copy.
    legacy_dir: the copy of the fixture.
  """
  old = _manifest(legacy_dir)
  for step in fixture.episode_steps(len(fixture.EPISODE_LENGTHS),
                                    _MORE_LENGTHS[-1]):
    loaded.observer(step)
  path = loaded.checkpoint()
  assert os.path.basename(path) == 'ckpt-000002'
  new = manifest_lib.read(os.path.join(path, manifest_lib.MANIFEST_NAME))
  reader = checkpoint_reader.CheckpointReader(path)
  spec = fixture.data_spec()
  for table in fixture.TABLES:
    want = fixture.expected_items(table, lengths=_MORE_LENGTHS)
    assert new['counts']['tables'][table]['items'] == len(want), table
    seen = set()
    for item in reader.items(table):
      trajectory = checkpoint_reader.unflatten(spec, item.columns)
      item_id = _item_id(trajectory)
      seen.add(item_id)
      _assert_same(trajectory, want[item_id], f'{table} item {item_id}')
      if table != fixture.PRIORITIZED_TABLE:
        continue
      if item_id[0] < len(fixture.EPISODE_LENGTHS):
        expected = _expected_priority(_table_config(old, table), item_id)
      else:  # Written after the load: the restored largest priority.
        expected = old['counts']['tables'][table]['max_priority']
      assert item.priority == expected, (table, item_id)
    assert seen == set(want), table
  # The previous release counted episode boundaries as env steps (its 40 are
  # carried over); steps written now do not: the 9-step episode ends with
  # one boundary.
  assert new['counts']['env_steps'] == (sum(fixture.EPISODE_LENGTHS) +
                                        _MORE_LENGTHS[-1] - 1)
  assert new['layout'] == {'name': 'columns'}


def test_the_writers_own_arguments_load_it(legacy_dir):
  """A program of the old release, unchanged, loads its buffer.

  It constructs the manager with the arguments that wrote the fixture (no
  layout argument, since the release had none) and calls
  `load_replay_buffer()`: the buffer loads, as layout 'columns'.

  Args:
    legacy_dir: the copy of the fixture.
  """
  manager = smart_replay.ReplayBufferManager(
      data_spec=fixture.data_spec(), capacity=fixture.CAPACITY,
      checkpoint_dir=legacy_dir, table_configs=fixture.table_configs(),
      sample_timeout_s=10.0, allow_version_mismatch=True)
  try:
    manager.load_replay_buffer()
    manifest = _manifest(legacy_dir)
    assert manager.stats()['tables']['prioritized']['items'] == manifest[
        'counts']['tables']['prioritized']['items']
    assert manager.layout == 'columns'
  finally:
    manager.close()
