"""Mixed batches on real Reverb tables: a read-only starter and the buffer."""

import math
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tree

import smart_replay
from tests import testing
from tests.smart_replay.backends.test_starter import make_starter

BATCHES, BATCH = 200, 32


def binomial_bounds(p, n, sigmas=5.0):
  """The range a Binomial(n, p) share falls in except ~1 time in 3.5 million."""
  half = sigmas * math.sqrt(p * (1 - p) / n)
  return p - half, p + half


def run_with_starter(make_manager, tmp_path, online_steps=40, **kwargs):
  """A manager on tmp_path/run with the starter tmp_path/starter mixed in."""
  starter_dir = make_starter(make_manager, tmp_path / 'starter', steps=80)
  manager = make_manager(tmp_path / 'run', starter_dir=starter_dir, **kwargs)
  _, observer = manager.create_replay_buffer()
  if online_steps:
    testing.run_actor(observer, online_steps, seed=7)
    observer.flush()
  return manager, starter_dir


def starter_share(dataset, batches=BATCHES):
  iterator = iter(dataset)
  sources = [next(iterator)[1].source[:, 0].numpy() for _ in range(batches)]
  return float(np.mean(np.concatenate(sources) == smart_replay.STARTER))


def items_by_key(manager, **kwargs):
  """{key: content} of every item a table holds (sampled until all seen)."""
  return testing.sample_all_items(manager, **kwargs)


def test_fixed_fraction_within_binomial_bounds(make_manager, tmp_path):
  manager, _ = run_with_starter(make_manager, tmp_path)
  for fraction in (0.0, 0.3, 1.0):
    share = starter_share(manager.get_dataset(
        batch_size=BATCH, num_steps=2, starter_fraction=fraction))
    low, high = binomial_bounds(fraction, BATCHES * BATCH)
    assert low <= share <= high, (fraction, share)


def test_annealed_fraction_follows_the_train_step(make_manager, tmp_path):
  manager, _ = run_with_starter(make_manager, tmp_path)
  schedule = smart_replay.FractionSchedule(initial=0.8, final=0.2, steps=1000)
  step = tf.Variable(0, dtype=tf.int64)
  dataset = manager.get_dataset(batch_size=BATCH, num_steps=2,
                                train_step=step, starter_fraction=schedule)
  for value in (0, 500, 1000, 4000):  # 0.8, 0.5, 0.2, 0.2
    step.assign(value)
    share = starter_share(dataset)  # A new iterator: nothing prefetched.
    low, high = binomial_bounds(schedule.value(value), BATCHES * BATCH)
    assert low <= share <= high, (value, share)
  with pytest.raises(ValueError, match='train_step'):
    manager.get_dataset(batch_size=BATCH, starter_fraction=schedule)


def test_elements_come_from_the_table_their_source_names(make_manager,
                                                         tmp_path):
  manager, starter_dir = run_with_starter(make_manager, tmp_path)
  online = items_by_key(manager)
  with smart_replay.ReplayBufferManager.from_checkpoint(
      starter_dir, checkpoint_dir=str(tmp_path / 'reader')) as reader:
    reader.load_replay_buffer(starter_dir)
    starter = items_by_key(reader)
  iterator = iter(manager.get_dataset(batch_size=BATCH, num_steps=2,
                                      starter_fraction=0.5))
  seen = {smart_replay.ONLINE: 0, smart_replay.STARTER: 0}
  for _ in range(20):
    trajectory, info = next(iterator)
    for b, (key, source) in enumerate(zip(info.key[:, 0].numpy(),
                                          info.source.numpy())):
      assert (source == source[0]).all()  # Broadcast over the steps.
      content = testing.item_fingerprint(
          tree.map_structure(lambda t: t[b].numpy(), trajectory))  # pylint: disable=cell-var-from-loop
      table = starter if source[0] == smart_replay.STARTER else online
      assert table[int(key)] == content
      seen[int(source[0])] += 1
  assert min(seen.values()) > 0


def test_importance_weights_per_source(make_manager, tmp_path):
  manager, _ = run_with_starter(make_manager, tmp_path, table_configs=[
      smart_replay.TableConfig(sampler='prioritized', importance_beta=1.0)])
  info = next(iter(manager.get_dataset(batch_size=BATCH,
                                       starter_fraction=0.5)))[1]
  # Give the online items different priorities, then sample again.
  keys = info.key[:, 0].numpy()[info.source[:, 0].numpy() == 0]
  manager.update_priorities(keys,
                            np.arange(1, len(keys) + 1, dtype=np.float64))
  for _ in range(5):
    info = next(iter(manager.get_dataset(batch_size=BATCH,
                                         starter_fraction=0.5)))[1]
    source, weight = info.source[:, 0].numpy(), info.weight[:, 0].numpy()
    probability, size = info.probability[:, 0].numpy(), \
        info.table_size[:, 0].numpy()
    starter_weights = weight[source == smart_replay.STARTER]
    np.testing.assert_allclose(starter_weights, 1.0)  # A uniform starter.
    online = source == smart_replay.ONLINE
    expected = 1.0 / (size[online] * probability[online])
    np.testing.assert_allclose(weight[online], expected / expected.max(),
                               rtol=1e-5)


def test_priority_updates_skip_starter_elements(make_manager, tmp_path):
  manager, _ = run_with_starter(make_manager, tmp_path, table_configs=[
      smart_replay.TableConfig(sampler='prioritized')])
  experience = next(iter(manager.get_dataset(batch_size=BATCH,
                                             starter_fraction=0.5)))
  update = manager.priority_update_fn(priorities_fn=lambda loss: loss)
  source = experience[1].source[:, 0]
  online = source.numpy() == smart_replay.ONLINE
  assert 0 < online.sum() < BATCH
  # Starter elements get a far larger "TD error": left out, it must not
  # become the online table's max priority (the priority of new items).
  update(experience, tf.where(source == smart_replay.STARTER, 50.0, 5.0))
  max_priority = manager.stats()['tables']['experience']['max_priority']
  assert max_priority == pytest.approx(5.0, abs=1e-3)


def test_the_starter_table_is_unchanged_by_training_and_a_restore(
    make_manager, tmp_path):
  manager, starter_dir = run_with_starter(make_manager, tmp_path)
  before_files = testing.dir_digest(starter_dir)
  starter_items = manager.starter.items
  info = manager.starter.client.server_info()['experience']
  inserts = info.rate_limiter_info.insert_stats.completed
  testing.run_actor(manager.observer, 30, seed=9)  # More online data.
  for _ in zip(range(50), manager.get_dataset(batch_size=BATCH,
                                               starter_fraction=0.5)):
    pass
  info = manager.starter.client.server_info()['experience']
  assert info.current_size == starter_items
  assert info.rate_limiter_info.insert_stats.completed == inserts
  online_items = manager.num_frames()
  path = manager.checkpoint()
  manager.close()
  # The run's checkpoint holds the online items and a reference, no copy.
  manifest = smart_replay.storage.checkpoint_folders.read_manifest(path)
  assert manifest['counts']['tables']['experience']['items'] == online_items
  assert manifest['starter']['path'] == starter_dir
  assert manifest['starter']['items'] == starter_items
  with smart_replay.ReplayBufferManager.from_checkpoint(
      str(tmp_path / 'run')) as resumed:
    resumed.load_replay_buffer()
    assert resumed.num_frames() == online_items
    assert resumed.starter.items == starter_items
    assert resumed.starter.fingerprint == manifest['starter']['fingerprint']
  assert testing.dir_digest(starter_dir) == before_files


def test_a_moved_starter_loads_a_different_one_is_refused(make_manager,
                                                          tmp_path):
  manager, starter_dir = run_with_starter(make_manager, tmp_path)
  recorded = manager.starter.fingerprint
  manager.checkpoint()
  manager.close()
  moved = str(tmp_path / 'moved')
  shutil.move(starter_dir, moved)
  run = str(tmp_path / 'run')
  with pytest.raises(smart_replay.CheckpointNotFoundError, match=starter_dir):
    with smart_replay.ReplayBufferManager.from_checkpoint(run) as lost:
      lost.load_replay_buffer()
  with smart_replay.ReplayBufferManager.from_checkpoint(
      run, starter_dir=moved) as found:
    found.load_replay_buffer()
    assert found.starter.fingerprint == recorded
    assert found.starter.reference()['path'] == moved
    found.checkpoint()  # Now records the new path.
  other = make_starter(make_manager, tmp_path / 'other', steps=50, seed=3)
  with pytest.raises(smart_replay.StarterMismatchError) as raised:
    with smart_replay.ReplayBufferManager.from_checkpoint(
        run, starter_dir=other) as wrong:
      wrong.load_replay_buffer()
  message = str(raised.value)
  assert recorded in message and other in message
  with smart_replay.ReplayBufferManager.from_checkpoint(run) as again:
    again.load_replay_buffer()  # The newest checkpoint names `moved`.
    assert again.starter.source == moved


def test_misuse_is_refused_with_what_to_do(make_manager, tmp_path):
  plain = make_manager(tmp_path / 'plain')
  plain.create_replay_buffer()
  with pytest.raises(smart_replay.ManagerStateError, match='starter_dir='):
    plain.get_dataset(batch_size=4, starter_fraction=0.5)
  plain.checkpoint()
  plain.close()
  starter_dir = make_starter(make_manager, tmp_path / 'starter')
  asking = make_manager(tmp_path / 'plain', starter_dir=starter_dir)
  with pytest.raises(smart_replay.StarterMismatchError,
                     match='written without a starter'):
    asking.load_replay_buffer()
  queue = make_manager(tmp_path / 'queue', starter_dir=starter_dir,
                       table_configs=[smart_replay.TableConfig(
                           sampler='fifo', max_times_sampled=1)])
  queue.create_replay_buffer()
  with pytest.raises(ValueError, match="online table 'experience' .*fifo"):
    queue.get_dataset(batch_size=4, starter_fraction=0.5)


def test_an_empty_online_table_times_out_naming_it(make_manager, tmp_path):
  manager, _ = run_with_starter(make_manager, tmp_path, online_steps=0,
                                sample_timeout_s=1.0)
  iterator = iter(manager.get_dataset(batch_size=8, starter_fraction=0.5))
  with pytest.raises(tf.errors.OpError,
                     match=r'WaitTimeoutError.*table .experience.*nothing could be sampled'):
    next(iterator)
  testing.run_actor(manager.observer, 20, seed=2)
  manager.observer.flush()
  _, info = next(iterator)  # The same iterator samples again.
  assert info.source.shape[0] == 8
  assert os.path.isdir(manager.starter.source)
