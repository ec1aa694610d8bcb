"""describe(): a buffer directory, a checkpoint folder, a running server."""

import os

import pytest

import smart_replay
from smart_replay.config import tables
from smart_replay.remote import replay_server as serve
from smart_replay.control import access as control_access
from smart_replay.control import credentials as credentials_lib
from smart_replay.tools import inspection
from tests import testing


def test_describes_a_buffer_directory(make_manager, tmp_path):
  manager = make_manager(capacity=500)
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 60)
  first = manager.checkpoint()
  testing.run_actor(observer, 20, seed=1)
  newest = manager.checkpoint(extra={'train_step': 3})
  stats = manager.stats()['tables']['experience']
  d = inspection.describe(str(tmp_path / 'buffer'))
  assert d['checkpoint'] == newest
  table = d['tables']['experience']
  assert (table['items'], table['capacity'], table['inserts']) == (
      stats['items'], 500, stats['inserts'])
  assert table['size'] == table['items']  # The older name.
  assert table['item_episodes'] == stats['item_episodes']
  assert (d['env_steps'], d['episodes']) == (80, manager.stats()['episodes'])
  assert table['rate_limiter'] == 'min_size_to_sample=1'
  assert [c['path'] for c in d['checkpoints']] == [first, newest]
  assert all(c['verified'] and c['bytes'] > 0 for c in d['checkpoints'])
  assert d['extra'] == {'train_step': 3}
  paths = [leaf['path'] for leaf in d['spec']]
  assert 'observation/temperature' in paths
  text = inspection.format_text(d)
  assert 'experience: sequence, uniform sampler' in text
  assert '    temperature: float32[3] in [-10.0, 40.0]' in text
  assert 'ckpt-000002' in text and 'ok' in text
  assert (f"  80 env steps, {d['episodes']} finished episodes, "
          f"{stats['items']} items\n") in text
  # One checkpoint folder works too.
  assert inspection.describe(first)['tables']['experience']['size'] < table[
      'size']


def test_verifying_large_checkpoints_shows_progress(make_manager, tmp_path,
                                                   monkeypatch):
  """Verifying reads every byte: above PROGRESS_BYTES, progress in MB."""
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 30)
  manager.checkpoint()
  testing.run_actor(observer, 30, seed=1)
  manager.checkpoint()
  shown = []

  class Recording(inspection.progress_log.ProgressLog):

    def update(self, done):
      shown.append((self._label, self._total, done))
      super().update(done)

  monkeypatch.setattr(inspection.progress_log, 'ProgressLog', Recording)
  inspection.describe(str(tmp_path / 'buffer'))
  assert not shown  # Small: no progress.
  monkeypatch.setattr(inspection, 'PROGRESS_BYTES', 0)
  d = inspection.describe(str(tmp_path / 'buffer'))
  total = sum(c['bytes'] for c in d['checkpoints']) >> 20
  assert shown == [('inspect: verifying checkpoints', total, done)
                   for done in (d['checkpoints'][1]['bytes'] >> 20, total)]


def test_damaged_and_missing_buffers_are_named(make_manager, tmp_path):
  with pytest.raises(smart_replay.CheckpointNotFoundError, match='nowhere'):
    inspection.describe(str(tmp_path / 'nowhere'))
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 30)
  path = manager.checkpoint()
  with open(os.path.join(path, 'chunks.tfrecord'), 'ab') as f:
    f.write(b'x')
  with pytest.raises(smart_replay.CheckpointCorruptError, match='verifies'):
    inspection.describe(str(tmp_path / 'buffer'))


def test_describes_a_running_server(tmp_path, data_spec):
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec, capacity=300, checkpoint_dir=str(tmp_path / 'b'),
      table_configs=[tables.TableConfig(sampler='prioritized')])
  with serve.ReplayServer(manager) as server:
    testing.run_actor(manager.observer, 40)
    manager.flush()
    d = inspection.describe_server(
        manager.server_address,
        control_address=f'localhost:{server.control_port}',
        credentials=credentials_lib.ClientCredentials.resolve(
            token_file=server.token_file))
    table = d['tables']['experience']
    assert table['items'] == table['size'] == manager.num_frames() > 0
    assert table['sampler'] == 'prioritized' and table['capacity'] == 300
    assert inspection.format_text(d).startswith(
        f'Buffer: {manager.server_address}')


def test_a_run_with_a_starter_shows_both_tables(make_manager, tmp_path):
  starter = make_manager(tmp_path / 'starter')
  _, observer = starter.create_replay_buffer()
  testing.run_actor(observer, 40)
  starter.checkpoint()
  starter.close()
  run = make_manager(tmp_path / 'run', starter_dir=str(tmp_path / 'starter'))
  _, observer = run.create_replay_buffer()
  testing.run_actor(observer, 20, seed=1)
  fingerprint = run.starter.fingerprint
  run.checkpoint()
  run.close()
  described = inspection.describe(str(tmp_path / 'run'))
  assert described['tables']['experience']['items'] == 19
  assert described['starter']['items'] == 39
  assert described['starter']['state'] == 'found'
  text = inspection.format_text(described)
  assert (f"starter (read-only, mixed into batches; not in these "
          f"checkpoints): table 'experience' of {tmp_path / 'starter'}, 39 "
          f"items, fingerprint {fingerprint} (ckpt-000001): found") in text
  os.rename(tmp_path / 'starter', tmp_path / 'elsewhere')
  assert inspection.describe(str(tmp_path / 'run'))['starter'][
      'state'].startswith('missing: pass its new path as starter_dir')
  other = make_manager(tmp_path / 'starter')
  _, observer = other.create_replay_buffer()
  testing.run_actor(observer, 10, seed=5)
  other.checkpoint()
  other.close()
  assert inspection.describe(str(tmp_path / 'run'))['starter'][
      'state'].startswith('DIFFERENT: holds fingerprints')
  assert inspection.describe(str(tmp_path / 'starter'))['starter'] is None
