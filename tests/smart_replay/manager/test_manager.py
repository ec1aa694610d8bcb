"""End-to-end tests of ReplayBufferManager on a real Reverb server."""

import logging
import os
import shutil
import threading
import time

import numpy as np
import pytest
import reverb
import tensorflow as tf
import tree

import smart_replay
from smart_replay.config import tables
from smart_replay.server import local_server as server_lib
from smart_replay import layouts
from smart_replay.spec import specs
from smart_replay.storage import files as checkpoint_files
from smart_replay.storage import checkpoint_folders as checkpoints
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import store as checkpoint_store
from smart_replay.writing import observer as observer_lib
from tests import testing


def _write(manager, steps, seed=0):
  record = testing.run_actor(manager.observer, steps, seed=seed)
  manager.flush()
  return record


# -- round trip and counts ----------------------------------------------------

def test_round_trip_actor_checkpoint_close_load(make_manager, tmp_path):
  manager = make_manager()
  manager.create_replay_buffer()
  record = _write(manager, 200)
  want_items = testing.expected_items(record.steps, 2)
  before = testing.sample_all_items(manager)
  assert len(before) == manager.num_frames() == len(want_items)
  path = manager.checkpoint()
  assert path == str(tmp_path / 'buffer' / 'checkpoints' / 'ckpt-000001')
  manager.close()

  fresh = make_manager()
  replay_buffer, observer = fresh.load_replay_buffer()
  assert fresh.num_frames() == replay_buffer.num_frames() == len(want_items)
  assert testing.sample_all_items(fresh) == before  # Same keys, same content.
  stats = fresh.stats()
  assert stats['env_steps'] == record.env_steps
  assert stats['episodes'] == sum(bool(s.is_boundary()) for s in record.steps)
  # Writing continues after a load, and counts carry on.
  testing.run_actor(observer, 20, seed=3)
  fresh.flush()
  assert fresh.num_frames() > len(want_items)


def test_counts_mean_what_they_say(make_manager):
  manager = make_manager()
  manager.create_replay_buffer()
  record = _write(manager, 100)
  items = len(testing.expected_items(record.steps, 2))
  stats = manager.stats()
  table = stats['tables']['experience']
  assert manager.num_frames() == table['items'] == items == table['inserts']
  assert stats['env_steps'] == record.env_steps
  assert stats['episodes'] == sum(bool(s.is_boundary()) for s in record.steps)
  assert table['max_size'] == 1000 and table['samples'] == 0
  next(iter(manager.get_dataset(batch_size=8)))
  assert manager.stats()['tables']['experience']['samples'] >= 8


def test_signature_comes_from_nested_spec_with_policy_info(make_manager):
  manager = make_manager(sequence_length=3)
  manager.create_replay_buffer()
  info = reverb.Client(manager.server_address).server_info(timeout=5)
  # The packed layout: one byte column of every field (4 bytes each here),
  # then 16 bytes of writer ids.
  assert specs.describe_signature(info['experience'].signature) == [
      'uint8[3, 56]']
  manager.close()
  manager = make_manager(sequence_length=3, layout='columns')
  manager.create_replay_buffer(overwrite=True)
  info = reverb.Client(manager.server_address).server_info(timeout=5)
  got = {l.path: l.describe()
         for l in specs.flatten_spec(info['experience'].signature)}
  assert got == {
      'step_type': 'int32[3]',
      'observation/occupancy': 'int32[3]',
      'observation/temperature': 'float32[3, 3]',
      'action': 'float32[3, 1]',
      'policy_info/log_probability': 'float32[3]',
      'next_step_type': 'int32[3]',
      'reward': 'float32[3]',
      'discount': 'float32[3]',
  }


def test_dataset_feeds_a_tf_agents_learner(tmp_path):
  from tf_agents.train import learner  # pylint: disable=g-import-not-at-top
  agent, train_step, collect = testing.cartpole_dqn(steps=100)
  with smart_replay.ReplayBufferManager(
      agent.collect_data_spec, capacity=1000,
      checkpoint_dir=str(tmp_path / 'dqn'), sequence_length=2,
      sample_timeout_s=10) as manager:
    _, observer = manager.create_replay_buffer()
    collect(observer)
    dqn_learner = learner.Learner(
        str(tmp_path / 'learner'), train_step, agent,
        lambda: manager.get_dataset(batch_size=16, num_steps=2),
        run_optimizer_variable_init=False)
    loss = dqn_learner.run(iterations=3)
    assert int(train_step.numpy()) == 3
    assert np.isfinite(loss.loss.numpy())
  assert manager.server_address is None


# -- 2. create really creates an empty buffer ---------------------------------

def test_create_on_a_dir_with_a_checkpoint_refuses(make_manager, tmp_path):
  manager = make_manager()
  manager.create_replay_buffer()
  _write(manager, 30)
  manager.checkpoint()
  manager.close()
  with pytest.raises(smart_replay.CheckpointExistsError) as raised:
    make_manager().create_replay_buffer()
  message = str(raised.value)
  assert str(tmp_path / 'buffer') in message
  assert 'load_replay_buffer()' in message and 'overwrite=True' in message
  fresh = make_manager()
  fresh.create_replay_buffer(overwrite=True)
  assert fresh.num_frames() == 0
  assert not os.path.exists(tmp_path / 'buffer' / 'checkpoints' / 'ckpt-000001')


def test_create_refuses_a_plain_reverb_checkpoint_dir(make_manager, tmp_path):
  buffer_dir = tmp_path / 'raw'
  table = reverb.Table.queue('experience', 10)
  server = reverb.Server([table], checkpointer=reverb.checkpointers.
                         DefaultCheckpointer(str(buffer_dir)))
  reverb.Client(f'localhost:{server.port}').checkpoint()
  server.stop()
  with pytest.raises(smart_replay.CheckpointExistsError, match='raw'):
    make_manager(buffer_dir).create_replay_buffer()


# -- 3. load restores or fails loudly ------------------------------------------

def test_load_without_checkpoint_names_the_directory(make_manager, tmp_path):
  with pytest.raises(smart_replay.CheckpointNotFoundError,
                     match=str(tmp_path / 'buffer')):
    make_manager().load_replay_buffer()


@pytest.fixture
def saved(make_manager):
  """A buffer directory with one checkpoint of 60 steps; returns its path."""
  manager = make_manager()
  manager.create_replay_buffer()
  _write(manager, 60)
  path = manager.checkpoint()
  manager.close()
  return path


def test_load_with_other_capacity_lists_the_difference(make_manager, saved):
  with pytest.raises(smart_replay.ManifestMismatchError) as raised:
    make_manager(capacity=500).load_replay_buffer()
  assert ('capacity', 1000, 500) in raised.value.differences
  assert 'capacity: checkpoint=1000, requested=500' in str(raised.value)
  assert 'tables/experience/max_size: checkpoint=1000, requested=500' in str(
      raised.value)


def test_load_with_other_spec_and_sequence_length_lists_each(
    make_manager, saved, data_spec):
  other = data_spec._replace(reward=tf.TensorSpec((), tf.float64, 'reward'))
  with pytest.raises(smart_replay.ManifestMismatchError) as raised:
    make_manager(data_spec=other, sequence_length=3).load_replay_buffer()
  fields = [d[0] for d in raised.value.differences]
  assert fields == ['data_spec/reward', 'sequence_length',
                    'tables/experience/sequence_length']
  assert "data_spec/reward: checkpoint='float32[]', requested='float64[]'" in str(
      raised.value)


def test_load_keeps_the_checkpoint_layout_unless_another_is_asked_for(
    make_manager, saved):
  assert checkpoints.verify(saved)['layout']['name'] == 'packed'
  with pytest.raises(smart_replay.ManifestMismatchError,
                     match="layout: checkpoint='packed', requested='columns'"):
    make_manager(layout='columns').load_replay_buffer()
  manager = make_manager()  # layout=None: the checkpoint's.
  manager.load_replay_buffer()
  assert manager.layout == 'packed'
  assert manager.num_frames() == checkpoints.verify(saved)['counts'][
      'tables']['experience']['items']
  manager.close()


def test_load_with_other_table_config_lists_it(make_manager, saved):
  with pytest.raises(smart_replay.ManifestMismatchError,
                     match="tables/experience/sampler: checkpoint='uniform', "
                     "requested='lifo'"):
    make_manager(table_configs=[tables.TableConfig(sampler='lifo')]
                 ).load_replay_buffer()


def test_load_accepts_a_specific_checkpoint_folder(make_manager, saved,
                                                   tmp_path):
  manager = make_manager(tmp_path / 'elsewhere')
  manager.load_replay_buffer(saved)
  assert manager.num_frames() == checkpoints.verify(saved)['counts'][
      'tables']['experience']['items']


def test_reverb_override_is_caught_after_start(make_manager, saved):
  # A manifest edited to agree with the request cannot fool the running check:
  # Reverb restores the checkpoint's own max_size, and the manager sees it.
  path = os.path.join(saved, manifest_lib.MANIFEST_NAME)
  stored = manifest_lib.read(path)
  stored['capacity'] = 500
  stored['tables'][0]['max_size'] = 500
  manifest_lib.write(path, stored)
  manager = make_manager(capacity=500)
  with pytest.raises(smart_replay.ManifestMismatchError,
                     match='tables/experience/max_size: running=1000, '
                     'requested=500'):
    manager.load_replay_buffer()
  # The half-started server was stopped: the manager can start again.
  assert manager.server_address is None
  manager.create_replay_buffer(overwrite=True)
  assert manager.num_frames() == 0


def test_versions_must_match_unless_allowed(make_manager, saved, caplog):
  path = os.path.join(saved, manifest_lib.MANIFEST_NAME)
  stored = manifest_lib.read(path)
  stored['versions']['dm-reverb'] = '0.13.0'
  manifest_lib.write(path, stored)
  with pytest.raises(smart_replay.ManifestMismatchError,
                     match="versions/dm-reverb: checkpoint='0.13.0', "
                     "requested='0.14.0'"):
    make_manager().load_replay_buffer()
  manager = make_manager(allow_version_mismatch=True)
  with caplog.at_level(logging.WARNING):
    manager.load_replay_buffer()
  assert manager.num_frames() > 0
  assert any('0.13.0' in r.getMessage() for r in caplog.records)


# -- 4. starter buffers are never modified -------------------------------------

def test_training_from_a_starter_leaves_it_untouched(make_manager, saved,
                                                     tmp_path):
  starter_dir = tmp_path / 'buffer'
  before = testing.dir_digest(starter_dir)
  items = checkpoints.verify(saved)['counts']['tables']['experience']['items']
  run = make_manager(tmp_path / 'run')
  run.load_replay_buffer(str(starter_dir))
  assert run.num_frames() == items
  _write(run, 50, seed=5)
  run.checkpoint()
  run.checkpoint()
  run.close()
  assert testing.dir_digest(starter_dir) == before
  assert [os.path.basename(p) for p in checkpoints.find_checkpoints(
      str(tmp_path / 'run'))] == ['ckpt-000002', 'ckpt-000001']
  # Loading a starter into a directory that has its own checkpoints refuses.
  with pytest.raises(smart_replay.CheckpointExistsError, match='mix two'):
    make_manager(tmp_path / 'run').load_replay_buffer(str(starter_dir))


def test_failed_overwrite_keeps_the_old_checkpoints(make_manager, saved,
                                                   tmp_path):
  run = make_manager(tmp_path / 'run')
  run.create_replay_buffer()
  _write(run, 20, seed=4)
  own = run.checkpoint()
  run.close()
  before = testing.dir_digest(tmp_path / 'run')
  # A starter that does not match: the error comes, the run's data stays.
  with pytest.raises(smart_replay.ManifestMismatchError):
    make_manager(tmp_path / 'run', capacity=999).load_replay_buffer(
        str(tmp_path / 'buffer'), overwrite=True)
  assert testing.dir_digest(tmp_path / 'run') == before
  # A create that cannot start (port in use) puts the old data back too.
  blocker = make_manager(tmp_path / 'other')
  blocker.create_replay_buffer()
  port = int(blocker.server_address.split(':')[1])
  with pytest.raises(ValueError, match='already in use'):
    make_manager(tmp_path / 'run', port=port).create_replay_buffer(
        overwrite=True)
  assert testing.dir_digest(tmp_path / 'run') == before
  assert checkpoints.verify(own)
  # A successful overwrite deletes them.
  make_manager(tmp_path / 'run').create_replay_buffer(overwrite=True)
  assert not os.path.exists(own)
  assert not os.path.exists(tmp_path / 'run' / checkpoints.REPLACED_DIR)


def test_busy_port_on_load_is_reported_as_such(make_manager, saved, tmp_path):
  blocker = make_manager(tmp_path / 'blocker')
  blocker.create_replay_buffer()
  port = int(blocker.server_address.split(':')[1])
  with pytest.raises(ValueError, match=f'port {port} is already in use'):
    make_manager(port=port).load_replay_buffer()
  checkpoints.verify(saved)  # Untouched, and not called corrupt.


# -- 5. checkpoint storage is safe ----------------------------------------------

def test_keeps_last_k_and_unrelated_files(make_manager, tmp_path):
  manager = make_manager(keep_checkpoints=2)
  manager.create_replay_buffer()
  (tmp_path / 'buffer' / 'zzz_notes.json').write_text('{}')
  paths = []
  for i in range(3):
    _write(manager, 10, seed=i)
    paths.append(manager.checkpoint())
    assert os.path.isdir(paths[-1])
  assert checkpoints.find_checkpoints(str(tmp_path / 'buffer')) == [
      paths[2], paths[1]]
  assert (tmp_path / 'buffer' / 'zzz_notes.json').read_text() == '{}'
  for path in paths[1:]:
    checkpoints.verify(path)


def test_damaged_newest_checkpoint_falls_back_with_warning(make_manager, caplog):
  manager = make_manager()
  manager.create_replay_buffer()
  _write(manager, 40)
  older = manager.checkpoint()
  older_items = manager.num_frames()
  _write(manager, 40, seed=1)
  newer = manager.checkpoint()
  manager.close()
  with open(os.path.join(newer, 'chunks.tfrecord'), 'r+b') as f:
    f.truncate(10)
  fresh = make_manager()
  with caplog.at_level(logging.WARNING):
    fresh.load_replay_buffer()
  assert fresh.num_frames() == older_items
  assert any(os.path.basename(older) in r.getMessage() and 'unusable' in
             r.getMessage() for r in caplog.records)
  fresh.close()
  shutil.rmtree(older)
  with pytest.raises(smart_replay.CheckpointCorruptError,
                     match='no usable checkpoint'):
    make_manager().load_replay_buffer()


def test_counts_are_exact_while_others_write_and_consume(make_manager,
                                                         data_spec):
  manager = make_manager(keep_checkpoints=3, table_configs=[tables.TableConfig(
      max_times_sampled=1)])
  manager.create_replay_buffer()
  _write(manager, 200)
  stop = threading.Event()

  def consume():  # A learner deleting items while the checkpoint is taken.
    iterator = iter(manager.get_dataset(batch_size=4, sample_timeout_s=0.2))
    while not stop.is_set():
      try:
        next(iterator)
      except tf.errors.OpError:
        pass

  def produce():  # An actor with its own client (as a remote one would be).
    remote = observer_lib.TrajectoryObserver(
        reverb.Client(manager.server_address),
        tables=[tables.TableConfig().resolve(capacity=100, sequence_length=2,
                                             stride_length=1)],
        data_spec=data_spec,
        layout=layouts.make_layout(manager.layout, data_spec))
    seed = 10
    while not stop.is_set():
      testing.run_actor(remote, 100, seed=seed)
      seed += 1
    remote.close()

  threads = [threading.Thread(target=consume, daemon=True),
             threading.Thread(target=produce, daemon=True)]
  for t in threads:
    t.start()
  paths = []
  try:
    for _ in range(3):
      time.sleep(0.2)  # Let them work between the checkpoints.
      paths.append(manager.checkpoint())
  finally:
    stop.set()  # Even when a checkpoint failed.
    for t in threads:
      t.join(timeout=60)
  for path in paths:
    manifest = checkpoints.verify(path)
    stored = checkpoint_files.count_items(path).get('experience', 0)
    assert manifest['counts']['tables']['experience']['items'] == stored
  manager.close()
  fresh = make_manager(keep_checkpoints=3, table_configs=[tables.TableConfig(
      max_times_sampled=1)])
  fresh.load_replay_buffer()  # Restored count == manifest count, or it raises.
  assert fresh.num_frames() == checkpoints.verify(paths[-1])['counts'][
      'tables']['experience']['items']


def test_concurrent_checkpoints_both_succeed(make_manager):
  manager = make_manager(keep_checkpoints=5)
  manager.create_replay_buffer()
  _write(manager, 50)
  results, failures = [], []

  def save():
    try:
      results.append(manager.checkpoint())
    except Exception as e:  # pylint: disable=broad-except
      failures.append(e)

  threads = [threading.Thread(target=save) for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=60)
  assert not failures
  assert sorted(os.path.basename(p) for p in results) == [
      'ckpt-000001', 'ckpt-000002', 'ckpt-000003']
  for path in results:
    checkpoints.verify(path)


def test_extra_metadata_is_stored_or_rejected_before_saving(make_manager):
  manager = make_manager()
  manager.create_replay_buffer()
  _write(manager, 20)
  with pytest.raises(ValueError,
                     match=r"extra\['train_step'\] = 5 \(int64\)"):
    manager.checkpoint(extra={'train_step': np.int64(5)})
  assert checkpoint_store.CheckpointStore(
      manager.checkpoint_dir).checkpoints() == []
  path = manager.checkpoint(extra={'train_step': 5})
  assert checkpoints.verify(path)['extra'] == {'train_step': 5}


def test_reverb_root_stays_empty_between_saves(make_manager, tmp_path):
  manager = make_manager()
  manager.create_replay_buffer()
  _write(manager, 20)
  manager.checkpoint()
  assert os.listdir(tmp_path / 'buffer' / checkpoints.REVERB_DIR) == []


# -- 7. nothing waits forever -------------------------------------------------

def test_port_in_use_is_refused(make_manager):
  first = make_manager()
  first.create_replay_buffer()
  port = int(first.server_address.split(':')[1])
  with pytest.raises(ValueError, match=f'port {port} is already in use'):
    make_manager(checkpoint_dir=None, port=port).create_replay_buffer(
        overwrite=True)


# -- 8. clear, close, context manager ------------------------------------------

@pytest.mark.parametrize('journal', ['every_second', False])
def test_clear_empties_and_a_load_restores_what_is_durable(make_manager,
                                                           journal):
  """Without a journal a load restores the checkpoint taken before the
  clear; with one, the journal replays the clear and what came after it."""
  manager = make_manager(journal=journal)
  manager.create_replay_buffer()
  _write(manager, 50)
  manager.checkpoint()
  saved_items = manager.num_frames()
  manager.clear()
  assert manager.num_frames() == 0
  stats = manager.stats()
  assert stats['env_steps'] == 0 and stats['tables']['experience']['inserts'] == 0
  record = _write(manager, 10, seed=2)  # Writing after clear works.
  assert manager.stats()['env_steps'] == record.env_steps
  after_clear = manager.num_frames()
  manager.close()
  fresh = make_manager(journal=journal)
  fresh.load_replay_buffer()
  assert fresh.num_frames() == (after_clear if journal else saved_items)
  if journal:
    assert fresh.stats()['env_steps'] == record.env_steps


def test_close_twice_stops_the_server(make_manager):
  manager = make_manager()
  manager.create_replay_buffer()
  address = manager.server_address
  manager.close()
  manager.close()
  with pytest.raises(smart_replay.WaitTimeoutError):
    server_lib.server_info(reverb.Client(address), 1.0)


def test_close_twice_context_manager_and_use_after_close(tmp_path, data_spec):
  with smart_replay.ReplayBufferManager(
      data_spec, capacity=100, checkpoint_dir=str(tmp_path / 'b')) as manager:
    manager.create_replay_buffer()
    address = manager.server_address
  manager.close()
  with pytest.raises(smart_replay.ManagerStateError, match='closed'):
    manager.num_frames()
  with pytest.raises(smart_replay.WaitTimeoutError):
    server_lib.server_info(reverb.Client(address), 1.0)


def test_methods_before_start_and_double_start(make_manager):
  manager = make_manager()
  with pytest.raises(smart_replay.ManagerStateError, match='not started'):
    manager.checkpoint()
  manager.create_replay_buffer()
  with pytest.raises(smart_replay.ManagerStateError, match='already started'):
    manager.create_replay_buffer()


@pytest.mark.parametrize('kwargs, match', [
    ({'capacity': 0}, 'capacity must be a positive integer, got 0'),
    ({'capacity': 10.5}, 'capacity'),
    ({'sequence_length': 0}, 'sequence_length'),
    ({'stride_length': -1}, 'stride_length'),
    ({'sample_timeout_s': 0}, 'sample_timeout_s'),
    ({'keep_checkpoints': 0}, 'keep_checkpoints'),
    ({'table_configs': [tables.TableConfig(), tables.TableConfig()]}, 'unique'),
])
def test_bad_arguments_are_named(make_manager, kwargs, match):
  with pytest.raises(ValueError, match=match):
    make_manager(**kwargs)


def test_manager_is_gin_configurable(tmp_path, data_spec):
  import gin  # pylint: disable=g-import-not-at-top
  config = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'configs',
                        'default.gin')
  gin.parse_config_file(config)
  try:
    manager = smart_replay.ReplayBufferManager(
        data_spec=data_spec, checkpoint_dir=str(tmp_path / 'gin'))
    manager.create_replay_buffer()
    assert manager.stats()['tables']['experience']['max_size'] == gin.query_parameter(
        'ReplayBufferManager.capacity')
    manager.close()
  finally:
    gin.clear_config()


def test_epochs_visit_every_item_once_in_shuffled_order(make_manager):
  manager = make_manager(capacity=100)
  _, observer = manager.create_replay_buffer()
  record = testing.run_actor(observer, 80, seed=9)
  want = sorted(testing.item_fingerprint(i)
                for i in testing.expected_items(record.steps, 2))
  assert manager.num_batches(16) == -(-len(want) // 16)
  assert manager.num_batches(16, drop_remainder=True) == len(want) // 16
  orders = []
  for seed in (1, 2):
    seen, keys = [], []
    for trajectory, batch_keys in manager.epoch(16, seed=seed):
      assert trajectory.reward.shape[1] == 2
      seen += [testing.item_fingerprint(tree.map_structure(
          lambda x, b=b: x[b], trajectory)) for b in range(len(batch_keys))]
      keys += batch_keys.tolist()
    assert sorted(seen) == want and len(set(keys)) == len(want)
    orders.append(keys)
  assert orders[0] != orders[1]  # Shuffled per seed.
  _, first_keys = next(iter(manager.epoch(5, seed=1)))
  assert first_keys.tolist() == orders[0][:5]  # Same seed, same order.
  assert manager.stats()['tables']['experience']['samples'] == 0
  full = list(manager.epoch(16, drop_remainder=True))
  assert len(full) == len(want) // 16


def test_epoch_checks_eagerly(make_manager):
  manager = make_manager(table_configs=[
      smart_replay.TableConfig(), smart_replay.TableConfig(
          name='episodes', kind='episode', episode_length=30)])
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 60, seed=4)
  with pytest.raises(ValueError, match='batch_size'):
    manager.epoch(0)  # At the call, not at the first batch.
  with pytest.raises(ValueError, match='lengths'):
    manager.epoch(4, table_name='episodes')
  assert sum(len(keys) for _, keys in manager.epoch(7)) == manager.num_frames()
