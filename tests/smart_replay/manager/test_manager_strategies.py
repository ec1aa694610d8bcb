"""Replay strategies end to end: prioritized replay, queues, rate limiters,
prefill checks and sampling statistics, on a real Reverb server."""

import collections
import os
import threading

import gin
import numpy as np
import pytest
import tensorflow as tf

import smart_replay
from smart_replay.apps import populate
from smart_replay.apps import training
from smart_replay.apps.envs import factory as env_factory
from smart_replay.apps.policies import factory as policy_factory
from smart_replay.config import tables
from tests import testing


def _prioritized(**kwargs):
  kwargs.setdefault('name', 'prioritized')
  return tables.TableConfig(sampler='prioritized', **kwargs)


def _filled(make_manager, steps=60, seed=0, **kwargs):
  manager = make_manager(**kwargs)
  manager.create_replay_buffer()
  record = testing.run_actor(manager.observer, steps, seed=seed)
  manager.flush()
  return manager, record


def _keys(manager, table):
  return sorted(manager.stats(times_sampled=True)['tables'][table][
      'times_sampled'])


# -- prioritized replay ---------------------------------------------------------

def test_prioritized_sampling_frequencies_follow_priorities(make_manager):
  alpha = 0.5
  manager, _ = _filled(make_manager, steps=14, table_configs=[
      _prioritized(priority_exponent=alpha)])
  keys = _keys(manager, 'prioritized')[:8]
  assert len(keys) == 8
  priorities = np.arange(1.0, 9.0) ** 2  # 1, 4, ..., 64.
  rest = [k for k in _keys(manager, 'prioritized') if k not in keys]
  manager.update_priorities(np.array(keys + rest, np.uint64),
                            np.concatenate([priorities,
                                            np.zeros(len(rest))]))
  counts = collections.Counter()
  n = 0
  for _, info in manager.get_dataset(batch_size=250).take(60):
    counts.update(info.key[:, 0].numpy().tolist())
    n += 250
  # Items set to priority 0 get only epsilon: (1e-6)^0.5 / sum ~ 3e-5.
  assert sum(counts[k] for k in rest) <= 0.002 * n
  want = priorities ** alpha / np.sum(priorities ** alpha)
  for key, p in zip(keys, want):
    freq = counts[key] / n
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(freq - p) < 5 * sigma + 1e-3, (key, freq, p)


def test_importance_weights_equal_the_formula(make_manager):
  alpha, beta = 0.7, 0.6
  manager, _ = _filled(make_manager, steps=14, table_configs=[
      _prioritized(priority_exponent=alpha, importance_beta=beta)])
  keys = _keys(manager, 'prioritized')
  priorities = np.linspace(0.5, 5.0, len(keys))
  manager.update_priorities(np.array(keys, np.uint64), -priorities)  # |TD|.
  stored = dict(zip(keys, priorities + 1e-6))  # |p| + epsilon.
  total = sum(p ** alpha for p in stored.values())
  trajectory, info = next(iter(manager.get_dataset(batch_size=64)))
  sampled = info.key[:, 0].numpy()
  probability = np.array([stored[k] ** alpha / total for k in sampled])
  np.testing.assert_allclose(info.probability[:, 0], probability, rtol=1e-6)
  np.testing.assert_allclose(info.priority[:, 0],
                             [stored[k] for k in sampled], rtol=1e-6)
  raw = (len(keys) * probability) ** -beta
  np.testing.assert_allclose(info.weight[:, 0], raw / raw.max(), rtol=1e-5)
  assert info.weight.shape == [64, 2] and trajectory.reward.shape == [64, 2]
  # Train kwargs form: the same weights, per sample, beside the experience.
  kwargs, _ = next(iter(manager.get_dataset(batch_size=8,
                                            as_train_kwargs=True)))
  assert set(kwargs) == {'experience', 'weights'}
  assert kwargs['weights'].shape == [8]


def test_beta_anneals_with_the_train_step(make_manager):
  manager, _ = _filled(make_manager, steps=14, table_configs=[_prioritized(
      importance_beta=0.0, importance_beta_final=1.0,
      importance_beta_steps=100)])
  keys = _keys(manager, 'prioritized')
  manager.update_priorities(np.array(keys, np.uint64),
                            np.linspace(1.0, 9.0, len(keys)))
  with pytest.raises(ValueError, match='pass the train step variable'):
    manager.get_dataset(batch_size=8)
  train_step = tf.Variable(0, dtype=tf.int64)
  dataset = manager.get_dataset(batch_size=32, train_step=train_step)
  _, info = next(iter(dataset))
  np.testing.assert_allclose(info.weight, 1.0)  # beta = 0.
  train_step.assign(200)  # Past the annealing: beta = 1.
  _, info = next(iter(dataset))
  expected = 1 / (len(keys) * info.probability[:, 0].numpy())
  np.testing.assert_allclose(info.weight[:, 0], expected / expected.max(),
                             rtol=1e-5)


def test_update_priorities_in_graph_and_new_items_get_the_max(make_manager):
  manager, _ = _filled(make_manager, steps=14, table_configs=[
      tables.TableConfig(), _prioritized(),
      _prioritized(name='fixed', initial_priority=0.25)])
  keys = _keys(manager, 'prioritized')

  @tf.function
  def update(keys, priorities):
    manager.update_priorities(keys, priorities, table_name='prioritized')

  update(tf.constant(keys, tf.uint64),
         tf.constant(np.full(len(keys), 7.0), tf.float64))
  assert manager.stats()['tables']['prioritized']['max_priority'] == \
      pytest.approx(7.0 + 1e-6)
  testing.run_actor(manager.observer, 20, seed=9)
  manager.flush()
  new = [k for k in _keys(manager, 'prioritized') if k not in keys]
  assert new
  _, info = next(iter(manager.get_dataset(batch_size=200,
                                          table_name='prioritized')))
  priority = dict(zip(info.key[:, 0].numpy(), info.priority[:, 0].numpy()))
  assert set(new) & set(priority)  # New items were sampled, at the max.
  np.testing.assert_allclose(list(priority.values()), 7.0 + 1e-6)
  _, info = next(iter(manager.get_dataset(batch_size=50, table_name='fixed')))
  assert set(info.priority.numpy().ravel()) == {0.25}
  # The max priority survives a checkpoint.
  path = manager.checkpoint()
  manager.close()
  again = smart_replay.ReplayBufferManager.from_checkpoint(path)
  again.load_replay_buffer()
  try:
    assert again.stats()['tables']['prioritized']['max_priority'] == \
        pytest.approx(7.0 + 1e-6)
  finally:
    again.close()


def test_update_priorities_rejects_mistakes(make_manager):
  manager, _ = _filled(make_manager, steps=10,
                       table_configs=[tables.TableConfig(), _prioritized()])
  keys = np.array(_keys(manager, 'prioritized'), np.uint64)
  with pytest.raises(ValueError, match="unknown table_name 'nope'"):
    manager.update_priorities(keys, np.ones(len(keys)), table_name='nope')
  with pytest.raises(ValueError, match="'experience' samples 'uniform'"):
    manager.update_priorities(keys, np.ones(len(keys)),
                              table_name='experience')
  with pytest.raises(ValueError, match=r'priorities\[1\] = nan is not finite'):
    manager.update_priorities(keys[:2], [1.0, np.nan])
  with pytest.raises(ValueError, match='3 keys but 2 priorities'):
    manager.update_priorities(keys[:3], [1.0, 2.0])
  plain, _ = _filled(make_manager, steps=5, checkpoint_dir=os.path.join(
      manager.checkpoint_dir, '..', 'plain'))
  with pytest.raises(ValueError, match='no prioritized table'):
    plain.update_priorities(keys, np.ones(len(keys)))


def test_learner_updates_priorities_with_weighted_loss(tmp_path):
  from tf_agents.train import learner  # pylint: disable=g-import-not-at-top
  agent, train_step, collect = testing.cartpole_dqn(steps=200)
  with smart_replay.ReplayBufferManager(
      agent.collect_data_spec, capacity=1000,
      checkpoint_dir=str(tmp_path / 'dqn'), sample_timeout_s=10,
      table_configs=[_prioritized(importance_beta=0.4,
                                  importance_beta_final=1.0,
                                  importance_beta_steps=10)]) as manager:
    _, observer = manager.create_replay_buffer()
    collect(observer)
    dqn_learner = learner.Learner(
        str(tmp_path / 'learner'), train_step, agent,
        lambda: manager.get_dataset(batch_size=32, train_step=train_step,
                                    as_train_kwargs=True),
        after_train_strategy_step_fn=manager.priority_update_fn(),
        use_kwargs_in_agent_train=True,
        # TF-Agents 0.19 wraps kwargs datasets twice when it pre-creates the
        # optimizer variables; they are created by the first step instead.
        run_optimizer_variable_init=False)
    loss = dqn_learner.run(iterations=5)
    assert np.isfinite(loss.loss.numpy())
    _, info = next(iter(manager.get_dataset(batch_size=200, train_step=train_step)))
    # Items the learner sampled now carry |TD error| + epsilon, not 1.0.
    assert (info.priority.numpy() != 1.0).any()


# -- queues -------------------------------------------------------------------

@pytest.mark.parametrize('sampler', ['fifo', 'lifo'])
def test_queue_yields_each_item_exactly_once_in_order(make_manager, sampler):
  manager, record = _filled(make_manager, steps=150, table_configs=[
      tables.TableConfig(name='queue', sampler=sampler, max_times_sampled=1,
                         block_inserts_when_full=True)])
  want = [testing.item_fingerprint(i)
          for i in testing.expected_items(record.steps, 2)]
  got, infos = testing.read_all_items(manager, 'queue', batch_size=7)
  assert got == (want if sampler == 'fifo' else want[::-1])
  keys = [key for key, _ in infos]
  assert len(keys) == len(set(keys)) == len(want)
  assert manager.num_frames() == 0


def test_full_queue_blocks_writers_instead_of_evicting(make_manager):
  manager = make_manager(capacity=5, write_timeout_s=1.0, table_configs=[
      tables.TableConfig(name='queue', max_times_sampled=1, sampler='fifo',
                         block_inserts_when_full=True)])
  manager.create_replay_buffer()
  with pytest.raises(smart_replay.WaitTimeoutError, match='rate limiter'):
    testing.run_actor(manager.observer, 40)
    manager.flush()
  state = manager.stats()['tables']['queue']
  assert state['items'] == 5 and state['rate_limiter']['can_insert'] is False
  with pytest.raises(smart_replay.WaitTimeoutError):
    manager.close()  # Says the pending items could not be written.


# -- rate limiter -----------------------------------------------------------------

def _is_sample_timeout(error):
  """A sample that waited `sample_timeout_s`, as the dataset raises it (a
  `tf.errors.OpError` naming the WaitTimeoutError, see docs/api.md)."""
  return isinstance(error, smart_replay.WaitTimeoutError) or (
      isinstance(error, tf.errors.OpError) and
      'WaitTimeoutError: Timed out' in error.message)


def test_ratio_limiter_holds_the_ratio_within_its_error_buffer(make_manager):
  spi, error_buffer, min_size = 3.0, 12.0, 10
  manager = make_manager(write_timeout_s=30, sample_timeout_s=2, table_configs=[
      tables.TableConfig(samples_per_insert=spi, error_buffer=error_buffer,
                         min_size_to_sample=min_size)])
  manager.create_replay_buffer()
  done = threading.Event()
  snapshots = []
  failures = []

  def write():
    try:
      testing.run_actor(manager.observer, 300, seed=4)
      manager.flush()
    except Exception as e:  # pylint: disable=broad-except
      failures.append(e)
    done.set()

  def sample():
    try:
      for _ in manager.get_dataset(batch_size=4, prefetch=1):
        if done.is_set():
          return
    except Exception as e:  # pylint: disable=broad-except
      # Once the writer is done the limiter holds sampling back for good, so
      # the sample under way times out (sample_timeout_s): the expected end.
      # A timeout while the writer still writes, or any other error, fails.
      if not (done.is_set() and _is_sample_timeout(e)):
        failures.append(e)

  threads = [threading.Thread(target=write), threading.Thread(target=sample)]
  for t in threads:
    t.start()
  while not done.is_set():
    info = manager.stats()['tables']['experience']
    snapshots.append((info['inserts'], info['samples']))
    done.wait(0.01)
  for t in threads:
    t.join(60)
  assert not [t.name for t in threads if t.is_alive()]
  assert not failures, failures
  inserts = [i for i, _ in snapshots if i >= min_size]
  assert inserts[-1] > 200
  low, high = spi * min_size - error_buffer, spi * min_size + error_buffer
  for i, s in snapshots:
    if i >= min_size:
      assert low <= i * spi - s <= high, (i, s)
  final = manager.stats()['tables']['experience']
  assert abs(final['samples'] / final['inserts'] - spi) < (
      error_buffer + spi * min_size) / final['inserts']


def test_stats_show_blocked_limiter_and_for_how_long(make_manager):
  manager = make_manager(write_timeout_s=0.5, table_configs=[
      tables.TableConfig(samples_per_insert=1.0, error_buffer=2.0,
                         min_size_to_sample=3)])
  manager.create_replay_buffer()
  state = manager.stats()['tables']['experience']['rate_limiter']
  assert state['type'] == 'samples_per_insert'
  assert state['can_insert'] and not state['can_sample']  # Empty table.
  assert state['inserts_before_blocking'] == 5
  with pytest.raises(smart_replay.WaitTimeoutError):
    testing.run_actor(manager.observer, 30)
    manager.flush()
  first = manager.stats()['tables']['experience']['rate_limiter']
  second = manager.stats()['tables']['experience']['rate_limiter']
  assert not first['can_insert'] and first['can_sample']
  assert second['insert_blocked_for_s'] > first['insert_blocked_for_s']
  assert second['sample_blocked_for_s'] == 0
  assert first['insert_wait_total_s'] >= 0.4  # Reverb's own measure.
  with pytest.raises(smart_replay.WaitTimeoutError):
    manager.close()


def test_times_sampled_per_item(make_manager):
  manager, _ = _filled(make_manager, steps=30)
  iterator = iter(manager.get_dataset(batch_size=10))
  for _ in range(5):
    next(iterator)
  stats = manager.stats(times_sampled=True)['tables']['experience']
  after = manager.stats()['tables']['experience']['samples']
  per_item = stats['times_sampled']
  assert len(per_item) == stats['items']
  # Exact per item; the dataset may still prefetch between the two reads.
  assert stats['samples'] <= sum(per_item.values()) <= after
  assert sum(stats['times_sampled_histogram'].values()) == stats['items']
  assert stats['mean_times_sampled'] == pytest.approx(
      stats['samples'] / stats['inserts'])
  assert not os.listdir(os.path.join(manager.checkpoint_dir, '.reverb'))


# -- prefill never hangs ------------------------------------------------------------

def test_prefill_that_would_block_is_rejected_up_front(make_manager):
  manager = make_manager(table_configs=[tables.TableConfig(
      samples_per_insert=2.0, error_buffer=10.0, min_size_to_sample=100)])
  manager.check_prefill(104)  # 100 free + 10 / 2 by the ratio.
  with pytest.raises(smart_replay.PrefillWouldBlockError,
                     match=r"table 'experience': up to 200 new items, but its "
                     r'samples_per_insert rate limiter lets only 105 in while '
                     r'nothing samples; raise error_buffer to >= 200, or set '
                     r'min_size_to_sample >= 195'):
    manager.check_prefill(200)
  # Stride 4 > length 2: short episodes still make one item each.
  strided = make_manager(os.path.join(manager.checkpoint_dir, '..', 's'),
                         stride_length=4, table_configs=[tables.TableConfig(
                             samples_per_insert=1.0, error_buffer=5.0)])
  with pytest.raises(smart_replay.PrefillWouldBlockError,
                     match='up to 12 new items'):
    strided.check_prefill(24)


def test_populate_rejects_a_blocking_limiter_and_trains_with_a_covering_one(
    tmp_path):
  def bind(min_size):
    gin.clear_config()
    gin.bind_parameter('ReplayBufferManager.table_configs', [
        tables.TableConfig(samples_per_insert=2.0, error_buffer=200.0,
                           min_size_to_sample=min_size)])
  try:
    bind(50)  # Lets 50 + 200 / 2 items in with nothing sampling.
    with pytest.raises(smart_replay.PrefillWouldBlockError,
                       match='min_size_to_sample >= 476'):
      populate.populate_starter_buffer(
          buffer_name='office', output_dir=str(tmp_path), steps_per_run=288,
          num_runs=2, show_progress=False)
    assert not populate.find_buffers(str(tmp_path), 'office', 2)
    bind(476)  # The minimum size the error suggested covers the prefill.
    result = populate.populate_starter_buffer(
        buffer_name='office', output_dir=str(tmp_path), steps_per_run=288,
        num_runs=2, show_progress=False)
  finally:
    gin.clear_config()
  # Train from it: a learner samples and an actor writes, in turns.
  manager = smart_replay.ReplayBufferManager.from_checkpoint(
      result.buffer_dir, checkpoint_dir=str(tmp_path / 'run'),
      sample_timeout_s=5, write_timeout_s=5)
  with manager:
    manager.load_replay_buffer(result.buffer_dir)
    assert manager.num_frames() >= 476
    iterator = iter(manager.get_dataset(batch_size=16, prefetch=1))
    for round_ in range(3):
      for _ in range(3):
        next(iterator)
      env = env_factory.make_environment('thermal', seed=round_)
      testing.run_actor(manager.observer, 20, env=env,
                         policy=policy_factory.make_policy('baseline', env=env))
      manager.flush()
    state = manager.stats()['tables']['experience']['rate_limiter']
    assert state['can_sample'] and state['can_insert']
  # The alternating collect/train loop would stall on it: refused up front.
  with pytest.raises(smart_replay.WouldBlockError,
                     match=r"rate-limited tables \[\('experience', 2.0\)\]"):
    training.train_from_starter(starter_dir=result.buffer_dir,
                                run_dir=str(tmp_path / 'sync'))
  assert not os.path.exists(tmp_path / 'sync' / 'buffer' / 'checkpoints')


def test_traced_update_priorities_fails_after_close(make_manager):
  manager, _ = _filled(make_manager, steps=10, table_configs=[_prioritized()])
  keys = tf.constant(_keys(manager, 'prioritized'), tf.uint64)

  @tf.function
  def update(keys):
    manager.update_priorities(keys, tf.ones(tf.shape(keys), tf.float64))

  update(keys)
  manager.close()
  with pytest.raises(tf.errors.InvalidArgumentError, match='is closed'):
    update(keys)  # Instead of waiting forever on the stopped server.


def test_python_int_keys_above_2_63_are_accepted(make_manager):
  manager, _ = _filled(make_manager, steps=30, table_configs=[_prioritized()])
  keys = _keys(manager, 'prioritized')  # Plain ints, half of them >= 2**63.
  manager.update_priorities(keys, [3.0] * len(keys))
  assert manager.stats()['tables']['prioritized']['max_priority'] == \
      pytest.approx(3.0 + 1e-6)


def test_clear_resets_counters_and_max_priority(make_manager):
  manager, _ = _filled(make_manager, steps=30, table_configs=[_prioritized()])
  manager.update_priorities(_keys(manager, 'prioritized'), [5.0] * len(
      _keys(manager, 'prioritized')))
  manager.clear()
  stats = manager.stats()
  assert stats['env_steps'] == stats['episodes'] == 0
  assert stats['tables']['prioritized']['max_priority'] == 1.0
  assert stats['tables']['prioritized']['items'] == 0
