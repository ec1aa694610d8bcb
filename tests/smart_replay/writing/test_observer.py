"""Tests for smart_replay.writing.observer, through a real Actor and a real server."""

import collections
import time

import numpy as np
import pytest
import reverb
import tensorflow as tf
from tf_agents.environments import batched_py_environment
from tf_agents.policies import random_py_policy
from tf_agents.replay_buffers import reverb_utils
from tf_agents.train import actor
from tf_agents.train.utils import train_utils
from tf_agents.trajectories import StepType
from tf_agents.trajectories import trajectory as trajectory_lib
import tree

import smart_replay
from smart_replay import errors
from smart_replay.config import reverb_tables
from smart_replay.config import tables
from smart_replay.writing import chunking
from smart_replay.writing import observer as observer_lib
from smart_replay_benchmarks import benchmark_lib as benchmark
from tests import testing


@pytest.mark.parametrize('sequence_length, stride_length', [(2, 1), (3, 1),
                                                            (3, 2)])
def test_items_are_the_windows_of_each_episode(make_manager, sequence_length,
                                               stride_length):
  manager = make_manager(sequence_length=sequence_length,
                         stride_length=stride_length)
  _, observer = manager.create_replay_buffer()
  record = testing.run_actor(observer, 150)
  observer.flush()
  want = [testing.item_fingerprint(i) for i in testing.expected_items(
      record.steps, sequence_length, stride_length)]
  assert manager.num_frames() == len(want) > 0
  got = testing.sample_all_items(manager)
  assert collections.Counter(got.values()) == collections.Counter(want)
  assert manager.stats()['env_steps'] == record.env_steps


def test_items_never_straddle_episodes(make_manager):
  manager = make_manager(sequence_length=4)
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 200)
  observer.flush()
  dataset = manager.get_dataset(batch_size=16)
  for trajectory, _ in dataset.take(20):
    step_type = trajectory.step_type.numpy()
    # A boundary (LAST) step may only close an item, and FIRST only open it.
    assert not (step_type[:, :-1] == StepType.LAST).any()
    assert not (step_type[:, 1:] == StepType.FIRST).any()


def test_a_new_actor_mid_episode_starts_a_new_episode(make_manager, env):
  # tf_agents.train.Actor resets its environment when built, so a second Actor
  # on the same observer starts with FIRST while an episode is still cached.
  manager = make_manager(sequence_length=3)
  _, observer = manager.create_replay_buffer()
  steps = []
  for seed in (0, 1, 2):
    steps += testing.run_actor(observer, 7, seed=seed, env=env).steps
  observer.flush()
  assert sum(bool(s.is_first()) for s in steps) > sum(
      bool(s.is_boundary()) for s in steps)  # Some episodes were cut short.
  want = [testing.item_fingerprint(i)
          for i in testing.expected_items(steps, 3)]
  got = testing.sample_all_items(manager)
  assert collections.Counter(got.values()) == collections.Counter(want)
  for trajectory, _ in manager.get_dataset(batch_size=8).take(10):
    assert not (trajectory.step_type.numpy()[:, 1:] == StepType.FIRST).any()


def test_observer_needs_a_trajectory_spec(make_manager):
  with pytest.raises(ValueError, match='must be a tf_agents Trajectory spec'):
    make_manager(data_spec={'x': tf.TensorSpec([1], tf.float32)})


def test_closed_observer_refuses_steps(make_manager, env):
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  observer.close()
  with pytest.raises(errors.ManagerStateError, match='observer is closed'):
    observer(_one_step(env, testing.make_policy(env)))


def _one_step(env, policy):
  time_step = env.reset()
  step = policy.action(time_step)
  next_step = env.step(step.action)
  return trajectory_lib.from_transition(time_step, step, next_step)


def test_bad_dtype_is_rejected_before_writing(make_manager, env):
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  record = testing.run_actor(observer, 40)
  observer.flush()
  before = manager.num_frames()
  good = _one_step(env, testing.make_policy(env))
  bad = good._replace(observation={
      **good.observation,
      'temperature': good.observation['temperature'].astype(np.float64)})
  with pytest.raises(errors.TrajectorySpecError) as raised:
    observer(bad)
  message = str(raised.value)
  assert "'observation/temperature'" in message
  assert 'expected dtype float32' in message and 'received dtype float64' in message
  observer.flush()
  assert manager.num_frames() == before
  assert manager.stats()['env_steps'] == record.env_steps
  # The table is not poisoned: it still samples, and writing goes on.
  trajectory, _ = next(iter(manager.get_dataset(batch_size=4)))
  assert trajectory.observation['temperature'].dtype.name == 'float32'
  testing.run_actor(observer, 20, seed=1)
  observer.flush()
  assert manager.num_frames() > before


def test_bad_shape_missing_field_and_batch_are_named(make_manager, env):
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  good = _one_step(env, testing.make_policy(env))
  with pytest.raises(errors.TrajectorySpecError,
                     match=r"'action'.*shape \(1,\).*shape \(2,\)"):
    observer(good._replace(action=np.zeros([2], np.float32)))
  with pytest.raises(errors.TrajectorySpecError, match='missing fields'):
    observer(good._replace(policy_info={}))
  batched = tree.map_structure(lambda x: np.stack([x, x]), good)
  with pytest.raises(errors.TrajectorySpecError, match='looks batched'):
    observer(batched)
  assert manager.stats()['env_steps'] == 0


def test_flush_against_blocked_rate_limiter_times_out(make_manager):
  manager = make_manager(
      write_timeout_s=1.0,
      table_configs=[tables.TableConfig(samples_per_insert=1.0,
                                        error_buffer=2.0)])
  _, observer = manager.create_replay_buffer()
  start = time.monotonic()
  with pytest.raises(errors.WaitTimeoutError,
                     match='rate limiter.*experience|experience.*rate limiter'):
    testing.run_actor(observer, 100)
    observer.flush()
  assert time.monotonic() - start < 10
  assert manager.num_frames() >= 1  # What was accepted is stored.
  # close() still stops the server, then reports the failed flush.
  with pytest.raises(errors.WaitTimeoutError, match='at flush'):
    manager.close()
  assert manager.server_address is None


def test_close_is_idempotent(make_manager):
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 10)
  observer.close()
  observer.close()
  assert manager.num_frames() > 0


# -- several tables, episodes, batched environments ---------------------------

def _queue(name, **kwargs):
  """A FIFO table read exactly once, so a test can read back every item."""
  return tables.TableConfig(name=name, sampler='fifo', max_times_sampled=1,
                            **kwargs)


def _read_tables(manager, *tables):
  """`{table: (items, infos)}` as `testing.read_all_items` returns them, of
  fifo tables read once: each in one batch of all its items (in the order
  written), the tables together, so the reads past their ends wait for the
  timeout at once, not once per table."""
  held = reverb.Client(manager.server_address).server_info(timeout=60)
  found, iterators = {}, []
  for table in tables:
    stored = held[table].current_size
    found[table] = ([], [])
    if not stored:
      continue
    iterators.append(iter(manager.get_dataset(
        batch_size=stored, table_name=table, sample_timeout_s=2.0,
        prefetch=1)))
    trajectory, info = next(iterators[-1])
    mask, keys = info.mask.numpy(), info.key.numpy()
    batch = tree.map_structure(lambda t: t.numpy(), trajectory)
    for b in range(stored):
      length = int(mask[b].sum())
      found[table][0].append(testing.item_fingerprint(tree.map_structure(
          lambda t: t[b, :length], batch)))  # pylint: disable=cell-var-from-loop
      found[table][1].append((int(keys[b, 0]), mask[b]))
  return found


@pytest.mark.parametrize('long_episodes', ['split', 'truncate', 'drop'])
def test_one_observer_feeds_sequence_and_episode_tables(make_manager,
                                                        long_episodes):
  manager = make_manager(sequence_length=2, table_configs=[
      _queue('pairs'), _queue('triples', sequence_length=3, stride_length=2),
      _queue('episodes', kind='episode', episode_length=5,
             long_episodes=long_episodes)])
  manager.create_replay_buffer()
  record = testing.run_actor(manager.observer, 300, seed=3)
  manager.observer.end_episode()
  manager.flush()
  stats = manager.stats()
  read = _read_tables(manager, 'pairs', 'triples', 'episodes')
  for name, length, stride in (('pairs', 2, 1), ('triples', 3, 2)):
    want = [testing.item_fingerprint(i) for i in testing.expected_items(
        record.steps, length, stride)]
    got, _ = read[name]
    assert got == want, name  # Same items, in write order.
  want = [testing.item_fingerprint(i) for i in testing.expected_episode_items(
      record.steps, 5, long_episodes)]
  got, infos = read['episodes']
  assert got == want
  lengths = [int(mask.sum()) for _, mask in infos]
  assert 0 < min(lengths) and max(lengths) == 5
  assert any(length < 5 for length in lengths)  # Padded ones exist.
  for _, mask in infos:  # Real steps first, then padding.
    assert list(mask) == sorted(mask, reverse=True)
  long_ones = stats['tables']['episodes']['long_episodes']
  assert long_ones > 0
  dropped = stats['tables']['episodes']['dropped_episodes']
  assert dropped == (long_ones if long_episodes == 'drop' else 0)


def test_episode_items_never_mix_two_episodes(make_manager):
  manager = make_manager(table_configs=[
      tables.TableConfig(name='episodes', kind='episode', episode_length=8)])
  manager.create_replay_buffer()
  testing.run_actor(manager.observer, 400, seed=5)
  manager.flush()
  trajectory, info = next(iter(manager.get_dataset(batch_size=64)))
  first = trajectory.step_type.numpy() == StepType.FIRST
  boundary = trajectory.next_step_type.numpy() == StepType.FIRST
  mask = info.mask.numpy()
  assert trajectory.reward.shape == [64, 8] and mask.shape == (64, 8)
  for b in range(64):
    length = int(mask[b].sum())
    # A FIRST step only opens a piece, a boundary step only closes it.
    assert not first[b, 1:length].any()
    assert not boundary[b, :length - 1].any()
    assert (trajectory.reward.numpy()[b, length:] == 0).all()  # Padding.
  assert (info.weight.numpy() == 1).all()


def test_sequence_items_cross_episodes_only_when_asked(make_manager):
  manager = make_manager(table_configs=[
      _queue('within'), _queue('across', cross_episodes=True)])
  manager.create_replay_buffer()
  record = testing.run_actor(manager.observer, 60, seed=2)
  manager.flush()
  read = _read_tables(manager, 'within', 'across')
  (within, _), (across, _) = read['within'], read['across']
  # Across: every window of the step stream.
  steps = record.steps
  want = [testing.item_fingerprint(tree.map_structure(
      lambda *xs: np.stack(xs), *steps[i - 1:i + 1]))
          for i in range(1, len(steps))]
  assert across == want
  assert len(within) == len(testing.expected_items(steps, 2))
  assert len(within) < len(across)


def test_batched_observer_equals_one_observer_per_environment(make_manager,
                                                              tmp_path):
  envs = [testing.make_env(seed=i, max_duration=3 + 4 * i) for i in range(4)]
  batched_env = batched_py_environment.BatchedPyEnvironment(envs)
  policy = random_py_policy.RandomPyPolicy(
      envs[0].time_step_spec(), envs[0].action_spec(),
      info_spec=testing.INFO_SPEC, outer_dims=(4,), seed=1)
  configs = [_queue('pairs'), _queue('episodes', kind='episode',
                                     episode_length=6)]
  batched = make_manager(tmp_path / 'batched', num_envs=4,
                         table_configs=configs)
  batched.create_replay_buffer()
  recorder = testing.Recorder()
  actor.Actor(batched_env, policy, train_utils.create_train_step(),
              steps_per_run=100, observers=[batched.observer, recorder]).run()
  batched.flush()
  single = make_manager(tmp_path / 'single', table_configs=configs)
  single.create_replay_buffer()
  observers = [single.observer] + [single.make_observer() for _ in range(3)]
  for step in recorder.steps:
    for i, obs in enumerate(observers):
      obs(tree.map_structure(lambda a: a[i], step))  # pylint: disable=cell-var-from-loop
  single.flush()
  written = recorder.env_steps  # 4 environments per recorded step
  assert batched.stats()['env_steps'] == written, len(recorder.steps)
  assert single.stats()['env_steps'] == written
  lengths = set()
  batched_read = _read_tables(batched, 'pairs', 'episodes')
  single_read = _read_tables(single, 'pairs', 'episodes')
  for name in ('pairs', 'episodes'):
    got, infos = batched_read[name]
    want, _ = single_read[name]
    assert collections.Counter(got) == collections.Counter(want), name
    assert len(got) > 20
    lengths |= {int(mask.sum()) for _, mask in infos}
  assert len(lengths) > 3  # Episodes of different lengths were written.


def test_batched_observer_checks_the_batch_dimension(make_manager, env):
  manager = make_manager(num_envs=2)
  manager.create_replay_buffer()
  step = _one_step(env, testing.make_policy(env))
  with pytest.raises(errors.TrajectorySpecError,
                     match=r"'step_type': expected dtype int32 shape \(2,\), "
                     r'received dtype int32 shape \(\).*looks unbatched'):
    manager.observer(step)
  with pytest.raises(ValueError, match='num_envs must be a positive integer'):
    make_manager(num_envs=0)


def test_batched_stream_after_a_failed_call_starts_a_new_episode(make_manager):
  """If environment 0's write times out, environment 1's step of that call is
  lost: its next step must not join the episode across the gap."""
  manager = make_manager(num_envs=2, write_timeout_s=0.3, table_configs=[
      tables.TableConfig(samples_per_insert=1.0, error_buffer=3.0),
      _queue('all')])
  manager.create_replay_buffer()
  envs = [testing.make_env(seed=i, max_duration=2 + 30 * i) for i in range(2)]
  env = batched_py_environment.BatchedPyEnvironment(envs)
  policy = random_py_policy.RandomPyPolicy(
      envs[0].time_step_spec(), envs[0].action_spec(),
      info_spec=testing.INFO_SPEC, outer_dims=(2,), seed=1)
  drain = iter(manager.get_dataset(batch_size=1, sample_timeout_s=0.2,
                                   prefetch=1))

  def catch_up():  # A learner samples until the limiter stops it.
    for _ in range(30):
      try:
        next(drain)
      except tf.errors.OpError:
        return

  time_step, streams, failures = env.reset(), ([], []), 0
  for _ in range(40):
    action = policy.action(time_step)
    next_time_step = env.step(action.action)
    step = trajectory_lib.from_transition(time_step, action, next_time_step)
    for k in range(2):
      streams[k].append(tree.map_structure(lambda a: np.asarray(a)[k], step))  # pylint: disable=cell-var-from-loop
    try:
      manager.observer(step)
    except errors.WaitTimeoutError:
      failures += 1
      catch_up()
    time_step = next_time_step
  catch_up()
  manager.flush()
  assert failures
  allowed = {testing.item_fingerprint(i) for k in range(2)
             for i in testing.expected_items(streams[k], 2)}
  items, _ = testing.read_all_items(manager, 'all', timeout_s=1.0)
  assert len(items) > 10
  # Every item is two steps that followed each other in one episode.
  assert set(items) <= allowed


# ------------------------------------------- same items as the stock observer

_PAIRS = tables.TableConfig().resolve(capacity=10, sequence_length=2,
                                      stride_length=1)

def _read_in_order(client, table):
  """Every item of a FIFO `max_times_sampled=1` table, in insertion order."""
  size = client.server_info(timeout=10)[table].current_size
  return [tuple(np.asarray(leaf) for leaf in sample.data)
          for sample in client.sample(table, num_samples=size,
                                      emit_timesteps=False)]


@pytest.mark.parametrize('sequence_length, stride_length, chunk_length',
                         [(2, 1, None), (2, 1, 3), (3, 1, 1), (3, 2, 4),
                          (3, 3, 32)])
def test_same_items_as_the_stock_tf_agents_observer(
    data_spec, sequence_length, stride_length, chunk_length):
  """Our fast path and ReverbAddTrajectoryObserver store identical items."""
  configs = {
      name: tables.TableConfig(
          name=name, sampler='fifo', max_times_sampled=1).resolve(
              capacity=10_000, sequence_length=sequence_length,
              stride_length=stride_length)
      for name in ('ours', 'stock')}
  server = reverb.Server([reverb_tables.make_table(c, data_spec)
                          for c in configs.values()])
  try:
    client = reverb.Client(f'localhost:{server.port}')
    # A real Actor's stream: episodes of 2 to 12 steps, some shorter than an
    # item, every one ending with a boundary step.
    record = testing.run_actor(lambda _: None, 400, seed=3)
    ours = observer_lib.TrajectoryObserver(
        client, tables=[configs['ours']], data_spec=data_spec,
        writes=smart_replay.WriteOptions(chunk_length=chunk_length))
    stock = reverb_utils.ReverbAddTrajectoryObserver(
        client, 'stock', sequence_length, stride_length=stride_length)
    for step in record.steps:
      ours(step)
      stock(step)
    ours.close()
    stock.close()
    got, want = _read_in_order(client, 'ours'), _read_in_order(client, 'stock')
  finally:
    server.stop()
  assert len(want) > 100, len(want)
  assert len(got) == len(want)
  for index, (mine, theirs) in enumerate(zip(got, want)):
    for a, b in zip(mine, theirs):
      np.testing.assert_array_equal(a, b, err_msg=f'item {index}')


def test_items_wait_for_their_chunk_until_flush_or_episode_end(make_manager,
                                                               env):
  manager = make_manager(chunk_length=16, table_configs=[
      tables.TableConfig(name='pairs')])
  _, observer = manager.create_replay_buffer()
  assert observer.chunk_length == 16
  policy = testing.make_policy(env)
  mid = np.asarray(StepType.MID, np.int32)
  for i in range(4):  # One episode, not finished: FIRST, MID, MID, MID.
    step = _one_step(env, policy)._replace(next_step_type=mid)
    observer(step if i == 0 else step._replace(step_type=mid))
  # Their chunk of 16 steps is still open: pending, not stored.
  stats = manager.stats()['tables']['pairs']
  assert (stats['stored_items'], stats['pending_items']) == (0, 3)
  assert manager.num_frames() == stats['items'] == 3
  assert observer.pending_items() == {'pairs': 3}
  observer.flush()
  stats = manager.stats()['tables']['pairs']
  assert (stats['stored_items'], stats['pending_items']) == (3, 0)
  assert manager.num_frames() == 3
  last = np.asarray(StepType.LAST, np.int32)
  for step_type in (mid, mid, last):  # The episode ends: its items are sent.
    observer(step._replace(step_type=step_type))
  assert manager.num_frames() == 6


@pytest.mark.parametrize('value', [0, -1, 2.5, True, '8'])
def test_chunk_length_must_be_a_positive_integer(make_manager, data_spec,
                                                 value):
  """Both the manager and the observer name the bad value."""
  with pytest.raises(ValueError, match=rf'chunk_length.*{value!r}'):
    make_manager(chunk_length=value)
  with pytest.raises(ValueError, match=rf'chunk_length.*{value!r}'):
    smart_replay.WriteOptions(chunk_length=value)


def test_automatic_chunk_length_shrinks_for_large_steps():
  assert chunking.auto_chunk_length(benchmark.data_spec(32)) == 32
  assert chunking.auto_chunk_length(benchmark.data_spec(1024)) == 8
  assert chunking.auto_chunk_length(benchmark.data_spec(10**6)) == 1


def _long_episode(env, steps):
  """`steps` steps of one unfinished episode: FIRST, then MID steps."""
  policy = testing.make_policy(env)
  mid = np.asarray(StepType.MID, np.int32)
  step = _one_step(env, policy)._replace(next_step_type=mid)
  return [step] + [step._replace(step_type=mid)] * (steps - 1)


def test_a_writer_never_runs_far_ahead_of_a_blocked_table(make_manager, env):
  """Back-pressure: a full queue stops the actor within ~50 items, mid-episode.

  Without it, items would pile up in the writer until the episode ends.
  Bound: 20 stored + at most 49 unconfirmed + two chunks of 32 steps.
  """
  manager = make_manager(write_timeout_s=0.5, table_configs=[
      tables.TableConfig(sampler='fifo', max_times_sampled=1, max_size=20,
                         block_inserts_when_full=True)])
  _, observer = manager.create_replay_buffer()
  written = 0
  with pytest.raises(errors.WaitTimeoutError, match='flush'):
    for step in _long_episode(env, 1000):
      observer(step)
      written += 1
  assert observer.chunk_length == 32
  assert 20 < written <= 20 + 49 + 2 * 32, written
  assert manager.num_frames() == 20
  with pytest.raises(errors.WaitTimeoutError, match='at flush'):
    manager.close()  # Its final flush meets the same full queue.


def test_a_long_episode_stays_under_reverbs_pending_items_warning(
    make_manager, env, capfd):
  manager = make_manager(capacity=5000)
  _, observer = manager.create_replay_buffer()
  for step in _long_episode(env, 3000):
    observer(step)
  observer.flush()
  assert manager.num_frames() == 2999
  assert 'alarmingly high' not in capfd.readouterr().err


def test_a_spec_with_an_unknown_dimension_is_refused_up_front(data_spec):
  spec = data_spec._replace(reward=tf.TensorSpec([None], tf.float32))
  with pytest.raises(ValueError, match=r"'reward' has shape \(None,\)"):
    observer_lib.TrajectoryObserver(
        None, tables=[_PAIRS],
        data_spec=spec)


def _episode_ids(checkpoint):
  """Reverb's episode ids of the chunks stored in `checkpoint`."""
  from reverb.cc import schema_pb2  # pylint: disable=g-import-not-at-top
  records = tf.data.TFRecordDataset(f'{checkpoint}/chunks.tfrecord',
                                    compression_type='ZLIB')
  return {schema_pb2.ChunkData.FromString(r).sequence_range.episode_id
          for r in records.as_numpy_iterator()}


def test_an_end_of_episode_that_timed_out_is_ended_before_the_next_step(
    make_manager):
  from tf_agents.environments import random_py_environment  # pylint: disable=g-import-not-at-top
  env = random_py_environment.RandomPyEnvironment(
      testing.OBSERVATION_SPEC, testing.ACTION_SPEC,
      episode_end_probability=0.0, min_duration=3, max_duration=3, seed=2)
  policy = testing.make_policy(env, 2)
  steps, time_step = [], env.reset()
  for _ in range(7):  # An episode of 3 steps, its boundary, 3 more steps.
    action = policy.action(time_step)
    next_time_step = env.step(action.action)
    steps.append(trajectory_lib.from_transition(time_step, action,
                                                next_time_step))
    time_step = next_time_step
  manager = make_manager(capacity=2, write_timeout_s=1.0, table_configs=[
      tables.TableConfig(name='queue', max_times_sampled=1, sampler='fifo',
                         block_inserts_when_full=True)])
  manager.create_replay_buffer()
  observer = manager.observer
  with pytest.raises(errors.WaitTimeoutError, match='the end of an episode'):
    for step in steps[:4]:  # 3 items; the queue takes 2.
      observer(step)
  snapshot = reverb.Client(manager.server_address).checkpoint  # No flush.
  first_episode = _episode_ids(snapshot())
  first, _ = testing.read_all_items(manager, 'queue', batch_size=1)
  assert len(first) == 3  # Reading made room for the pending item.
  for step in steps[4:7]:  # Ends the first episode in Reverb, then writes.
    observer(step)
  observer.flush()
  second_episode = _episode_ids(snapshot())
  assert len(first_episode) == len(second_episode) == 1
  assert first_episode != second_episode  # Reverb's episode was ended.
  second, _ = testing.read_all_items(manager, 'queue', batch_size=1)
  want = [testing.item_fingerprint(i)
          for i in testing.expected_items(steps[:7], 2)]
  assert sorted(first + second) == sorted(want)


def test_num_frames_counts_the_open_chunk_and_a_checkpoint_changes_nothing(
    make_manager):
  """num_frames() and stats()'s items count the items of the open chunk
  (pending), without sending them early; a checkpoint sends them, and no
  count changes."""
  manager = make_manager(chunk_length=64)
  _, observer = manager.create_replay_buffer()
  env = testing.make_env(max_duration=1000)  # one long episode
  record = testing.run_actor(observer, 40, env=env)
  want = len(testing.expected_items(record.steps, 2))
  before = manager.stats()['tables']['experience']
  assert before['items'] == before['items_written'] == want
  assert 0 < before['pending_items'] < observer.chunk_length  # Open chunk,
  assert before['stored_items'] == want - before['pending_items']
  again = manager.stats()['tables']['experience']  # not sent by counting.
  assert again['stored_items'] == before['stored_items']
  assert manager.num_frames() == want
  manager.checkpoint()
  after = manager.stats()['tables']['experience']
  assert manager.num_frames() == after['items'] == after['stored_items'] == want
  assert after['pending_items'] == 0


def test_num_frames_does_not_change_across_a_checkpoint_after_an_actor_run(
    make_manager):
  """As reported: after Actor.run(), num_frames() equals the count after a
  checkpoint of the same buffer, whichever step the run ended on."""
  manager = make_manager(capacity=10_000)  # The automatic chunk length.
  _, observer = manager.create_replay_buffer()
  env = testing.make_env(max_duration=300)
  # Runs end 12, 31, 30 and 9 steps into a chunk of 32 (the reported
  # runs were of about 1,000 steps: the offset is what matters).
  for run, steps in enumerate((300, 307, 319, 331)):
    testing.run_actor(observer, steps, seed=run, env=env)
    before = manager.num_frames()
    manager.checkpoint()
    assert manager.num_frames() == before == observer.num_items, run
