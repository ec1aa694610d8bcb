"""Tests for smart_replay.backends.starter on real Reverb servers."""

import json
import os
import shutil

import pytest

import smart_replay
from smart_replay.backends import starter as starter_lib
from tests import testing


def make_starter(make_manager, directory, steps=60, seed=0, **kwargs):
  """A starter buffer of `steps` random env steps; returns its directory."""
  manager = make_manager(directory, **kwargs)
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, steps, seed=seed)
  manager.checkpoint()
  manager.close()
  return str(directory)


def test_serves_the_newest_checkpoint_read_only(make_manager, tmp_path):
  starter_dir = make_starter(make_manager, tmp_path / 'starter')
  before = testing.dir_digest(starter_dir)
  with starter_lib.StarterSource(starter_dir) as source:
    manifest = source.manifest
    assert source.path.endswith('ckpt-000001')
    assert source.items == manifest['counts']['tables']['experience']['items']
    info = source.client.server_info()['experience']
    assert info.current_size == source.items
    assert source.reference() == {
        'path': starter_dir, 'checkpoint': source.path,
        'fingerprint': starter_lib.fingerprint(manifest),
        'table': 'experience', 'items': source.items}
    root = source._root  # pylint: disable=protected-access
    assert os.listdir(root) == []  # Nothing is checkpointed there.
  assert not os.path.exists(root)
  assert testing.dir_digest(starter_dir) == before
  source.close()  # Safe twice.


def test_fingerprint_is_the_content_a_copy_keeps(make_manager, tmp_path):
  first = make_starter(make_manager, tmp_path / 'a')
  copy = str(tmp_path / 'copy')
  shutil.copytree(first, copy)
  other = make_starter(make_manager, tmp_path / 'b', seed=1)
  manifest = lambda d: json.load(open(os.path.join(
      d, 'checkpoints', 'ckpt-000001', 'manifest.json')))
  assert (starter_lib.fingerprint(manifest(first)) ==
          starter_lib.fingerprint(manifest(copy)))
  assert (starter_lib.fingerprint(manifest(first)) !=
          starter_lib.fingerprint(manifest(other)))
  wanted = starter_lib.fingerprint(manifest(first))
  with starter_lib.StarterSource(copy, expected_fingerprint=wanted) as source:
    assert source.fingerprint == wanted
  with pytest.raises(smart_replay.StarterMismatchError) as raised:
    starter_lib.StarterSource(other, expected_fingerprint=wanted)
  got = starter_lib.fingerprint(manifest(other))
  assert wanted in str(raised.value) and got in str(raised.value)


def test_a_starter_that_could_not_be_sampled_forever_is_refused(
    make_manager, tmp_path):
  limited = make_starter(make_manager, tmp_path / 'limited', table_configs=[
      smart_replay.TableConfig(samples_per_insert=4.0, error_buffer=1000.0)])
  with pytest.raises(smart_replay.WouldBlockError,
                     match=r"samples_per_insert=4.0.*read-only starter"):
    starter_lib.StarterSource(limited)


def test_missing_starter_names_the_path(tmp_path):
  with pytest.raises(smart_replay.CheckpointNotFoundError,
                     match=str(tmp_path / 'nowhere')):
    starter_lib.StarterSource(str(tmp_path / 'nowhere'))
