"""Tests for smart_replay.storage.checkpoint_folders and smart_replay.storage.files."""

import os

import numpy as np
import pytest
import reverb
import tensorflow as tf

from smart_replay import errors
from smart_replay.storage import coordinated_records
from smart_replay.storage import files as checkpoint_files
from smart_replay.storage import checkpoint_folders as checkpoints
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import store as checkpoint_store

SIGNATURE = {'x': tf.TensorSpec([2, 3], tf.float32)}


def _reverb_checkpoint(root, num_items):
  """Writes a real Reverb checkpoint of `num_items` items into `root`."""
  table = reverb.Table('t', reverb.selectors.Uniform(), reverb.selectors.Fifo(),
                       100, reverb.rate_limiters.MinSize(1),
                       signature=SIGNATURE)
  server = reverb.Server(
      [table], checkpointer=reverb.checkpointers.DefaultCheckpointer(root))
  client = reverb.Client(f'localhost:{server.port}')
  with client.trajectory_writer(2) as writer:
    for i in range(num_items + 1):
      writer.append({'x': np.full([3], i, np.float32)})
      if i:
        writer.create_item('t', 1.0, {'x': writer.history['x'][-2:]})
  path = client.checkpoint()
  server.stop()
  return path


def _commit(store, num_items, extra=None):
  path = _reverb_checkpoint(store.prepare_reverb_root(), num_items)
  return store.commit(path, lambda name, files: manifest_lib.build_manifest(
      {'n': num_items}, counts={}, files=files, checkpoint_name=name,
      extra=extra))


def test_commit_numbers_verifies_and_keeps_last_k(tmp_path):
  store = checkpoint_store.CheckpointStore(str(tmp_path), keep=2)
  (tmp_path / 'notes.txt').write_text('mine')
  paths = [_commit(store, n) for n in (1, 2, 3)]
  assert [os.path.basename(p) for p in paths] == [
      'ckpt-000001', 'ckpt-000002', 'ckpt-000003']
  assert store.checkpoints() == paths[1:]
  assert os.listdir(store.reverb_root) == []  # Reverb's root is left empty.
  assert (tmp_path / 'notes.txt').read_text() == 'mine'
  manifest = checkpoints.verify(paths[2])
  assert manifest['n'] == 3 and manifest['checkpoint'] == 'ckpt-000003'
  assert checkpoint_files.count_items(paths[2]) == {'t': 3}


def test_coordinated_checkpoints_are_kept_apart_from_scheduled_ones(tmp_path):
  store = checkpoint_store.CheckpointStore(str(tmp_path), keep=2)
  ids = {n: f'20261126T0600{n:02d}Z-0000000{n}' for n in range(1, 6)}
  tag = lambda n: {coordinated_records.EXTRA_KEY: ids[n]}

  def commit_record(n):  # Phase 2 of a coordinated save: its record.
    folder = tmp_path / coordinated_records.RECORDS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    (folder / f'{ids[n]}.json').write_text('{}')

  first = _commit(store, 1, extra=tag(1))
  commit_record(1)
  second = _commit(store, 2, extra=tag(2))
  commit_record(2)
  scheduled = [_commit(store, n) for n in (3, 4, 5)]
  # Three scheduled saves since: the two coordinated ones are still there.
  assert store.checkpoints() == [first, second] + scheduled[1:]
  # The review's C2: coordinated saves that never commit (a crashed learner,
  # or a token holder's) keep only the newest of them, and never prune a
  # committed one.
  uncommitted = [_commit(store, 6, extra=tag(3)),
                 _commit(store, 7, extra=tag(4))]
  assert store.checkpoints() == ([first, second] + scheduled[1:] +
                                 uncommitted[1:])
  third = _commit(store, 8, extra=tag(5))
  commit_record(5)
  _commit(store, 9)  # The next save prunes by the records.
  assert set(store.checkpoints()) >= {second, third}
  assert first not in store.checkpoints()


def test_verify_detects_damage_and_missing_manifest(tmp_path):
  store = checkpoint_store.CheckpointStore(str(tmp_path))
  path = _commit(store, 2)
  with open(os.path.join(path, 'chunks.tfrecord'), 'ab') as f:
    f.write(b'garbage')
  with pytest.raises(errors.CheckpointCorruptError, match='chunks.tfrecord has'):
    checkpoints.verify(path)
  os.remove(os.path.join(path, manifest_lib.MANIFEST_NAME))
  with pytest.raises(errors.CheckpointCorruptError, match='no readable manifest'):
    checkpoints.verify(path)


def test_find_checkpoints_root_or_folder(tmp_path):
  store = checkpoint_store.CheckpointStore(str(tmp_path), keep=3)
  first, second = _commit(store, 1), _commit(store, 2)
  assert checkpoints.find_checkpoints(str(tmp_path)) == [second, first]
  assert checkpoints.find_checkpoints(first) == [first]
  with pytest.raises(errors.CheckpointNotFoundError, match='does not exist'):
    checkpoints.find_checkpoints(str(tmp_path / 'nope'))
  (tmp_path / 'empty').mkdir()
  with pytest.raises(errors.CheckpointNotFoundError,
                     match=str(tmp_path / 'empty')):
    checkpoints.find_checkpoints(str(tmp_path / 'empty'))


def test_leftovers_in_reverb_root_are_moved_aside_not_deleted(tmp_path):
  store = checkpoint_store.CheckpointStore(str(tmp_path))
  leftover = _reverb_checkpoint(store.prepare_reverb_root(), 2)
  store.prepare_reverb_root()
  assert os.listdir(store.reverb_root) == []
  moved = tmp_path / checkpoints.ORPHANED_DIR / os.path.basename(leftover)
  assert checkpoint_files.is_reverb_checkpoint(str(moved))


def test_existing_data_sees_raw_reverb_checkpoints(tmp_path):
  store = checkpoint_store.CheckpointStore(str(tmp_path))
  assert store.existing_data() == []
  raw = _reverb_checkpoint(str(tmp_path), 1)  # A plain Reverb root.
  assert store.existing_data() == [raw]


@pytest.mark.parametrize('keep', [0, -1, 1.5])
@pytest.mark.unit
def test_bad_keep(tmp_path, keep):
  with pytest.raises(ValueError, match='keep_checkpoints'):
    checkpoint_store.CheckpointStore(str(tmp_path), keep=keep)


# -- choosing the first usable checkpoint (no Reverb server) -------------------

def _first(candidates, try_one, failure):
  for attempt in checkpoints.attempts(candidates, failure=failure):
    with attempt:
      return try_one(attempt.path)


@pytest.mark.unit
def test_attempts_fall_back_past_a_damaged_one():
  def try_one(path):
    if path == 'ckpt-3':
      raise errors.CheckpointCorruptError('ckpt-3 is damaged: x changed')
    return f'loaded {path}'
  assert _first(['ckpt-3', 'ckpt-2', 'ckpt-1'], try_one,
                failure='none') == 'loaded ckpt-2'


@pytest.mark.unit
def test_attempts_list_every_problem():
  def try_one(path):
    raise errors.CheckpointCorruptError(f'{path} is damaged')
  with pytest.raises(errors.CheckpointCorruptError,
                     match=r'^no usable checkpoint in /b: ckpt-2 is damaged '
                     r'\| ckpt-1 is damaged$'):
    _first(['ckpt-2', 'ckpt-1'], try_one,
           failure='no usable checkpoint in /b')


@pytest.mark.unit
def test_attempts_do_not_hide_other_errors():
  def try_one(path):
    raise OSError(f'{path}: disk gone')
  with pytest.raises(OSError, match='disk gone'):
    _first(['ckpt-1'], try_one, failure='none')


@pytest.mark.unit
def test_read_manifest_names_the_checkpoint(tmp_path):
  with pytest.raises(errors.CheckpointCorruptError, match=str(tmp_path)):
    checkpoints.read_manifest(str(tmp_path))
