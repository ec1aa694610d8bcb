"""Tests for smart_replay.apps.training (the library function)."""

import glob
import os

import pytest
import tensorflow as tf
from tf_agents.policies import policy_saver
from tf_agents.policies import random_tf_policy
from tf_agents.specs import tensor_spec

import smart_replay
from smart_replay.apps import populate
from smart_replay.apps import training
from smart_replay.apps.envs import factory
from smart_replay.storage import checkpoint_folders as checkpoints
from tests import testing


@pytest.fixture(scope='module')
def cartpole_starter(tmp_path_factory):
  return populate.populate_starter_buffer(
      buffer_name='cp', output_dir=str(tmp_path_factory.mktemp('starters')),
      env='gym:CartPole-v1', policy='random', steps_per_run=500, num_runs=2,
      show_progress=False).buffer_dir


def _train(starter, run_dir, **kwargs):
  kwargs.setdefault('num_train_steps', 200)
  kwargs.setdefault('collect_steps_per_iteration', 50)
  kwargs.setdefault('train_steps_per_iteration', 50)
  kwargs.setdefault('checkpoint_every', 100)
  kwargs.setdefault('eval_episodes', 0)
  return training.train_from_starter(starter_dir=starter, run_dir=str(run_dir),
                                     **kwargs)


def test_sac_on_thermal_leaves_the_starter_untouched(tmp_path):
  starter = populate.populate_starter_buffer(
      buffer_name='office', output_dir=str(tmp_path / 'starters'),
      num_runs=1, show_progress=False)
  before = testing.dir_digest(starter.buffer_dir)
  result = _train(starter.buffer_dir, tmp_path / 'run', agent='sac',
                  batch_size=32, eval_episodes=1)
  assert testing.dir_digest(starter.buffer_dir) == before
  assert result.train_step == 200 and result.items_at_start == starter.items
  assert result.items == starter.items + result.items_collected
  assert result.greedy_return < 0  # A cost; finite.
  # Buffer stats sit beside the agent's summaries.
  tags = set()
  for path in glob.glob(str(tmp_path / 'run' / 'train' / 'events.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(v.tag for v in event.summary.value)
  assert {'buffer/items', 'buffer/inserts', 'buffer/samples',
          'buffer/episodes'} <= tags


def test_starter_that_does_not_fit_the_agent_lists_differences(tmp_path):
  env = factory.make_environment('gym:CartPole-v1')
  policy = random_tf_policy.RandomTFPolicy(
      tensor_spec.from_spec(env.time_step_spec()),
      tensor_spec.from_spec(env.action_spec()), emit_log_probability=True)
  policy_saver.PolicySaver(policy).save(str(tmp_path / 'policy'))
  starter = populate.populate_starter_buffer(
      buffer_name='info', output_dir=str(tmp_path), env='gym:CartPole-v1',
      policy=f'saved:{tmp_path / "policy"}', steps_per_run=50, num_runs=1,
      show_progress=False)
  with pytest.raises(smart_replay.ManifestMismatchError) as raised:
    _train(starter.buffer_dir, tmp_path / 'run', agent='dqn')
  assert raised.value.differences == [
      ('data_spec/policy_info/log_probability', 'float32[]', '<missing>')]
  assert 'policy_info/log_probability: starter float32[], agent <missing>' in (
      str(raised.value))
  assert not os.path.exists(tmp_path / 'run')


def test_existing_run_is_refused(cartpole_starter, tmp_path):
  _train(cartpole_starter, tmp_path / 'run', num_train_steps=50)
  with pytest.raises(smart_replay.CheckpointExistsError, match='resume=True'):
    _train(cartpole_starter, tmp_path / 'run', num_train_steps=50)
  again = _train(cartpole_starter, tmp_path / 'run', num_train_steps=50,
                 overwrite=True)
  assert again.resumed_from is None and again.train_step == 50


def test_interrupt_then_resume_continues_from_the_pair(cartpole_starter,
                                                       tmp_path):
  polls = {'n': 0}

  def stop_after_three_iterations():
    polls['n'] += 1
    return polls['n'] > 3

  first = _train(cartpole_starter, tmp_path / 'run', num_train_steps=400,
                 stop_requested=stop_after_three_iterations)
  assert first.interrupted and first.train_step == 150
  assert first.checkpoint.train_step == 150
  saved_items = checkpoints.verify(first.checkpoint.buffer_checkpoint)[
      'counts']['tables']['experience']['items']
  resumed = _train(cartpole_starter, tmp_path / 'run', num_train_steps=400,
                   resume=True)
  assert resumed.resumed_from == 150 and resumed.train_step == 400
  assert resumed.items_at_start == saved_items and resumed.items_replayed == 0
  assert resumed.items == saved_items + resumed.items_collected


def test_resume_keeps_the_target_network(cartpole_starter, tmp_path):
  first = _train(cartpole_starter, tmp_path / 'run', num_train_steps=150)
  path = first.checkpoint.agent_checkpoint
  reader = tf.train.load_checkpoint(path)
  targets = {name: reader.get_tensor(name)
             for name in reader.get_variable_to_shape_map()
             if '_target_q_network' in name and 'OPTIMIZER' not in name}
  assert targets
  online = {name.replace('_target_q_network', '_q_network'): value
            for name, value in targets.items()}
  assert any((reader.get_tensor(n) != v).any() for n, v in online.items()
             if n in reader.get_variable_to_shape_map())
  # Resume without training: the final save must hold the same targets
  # (the Learner's constructor re-initializes them if restored too early).
  _train(cartpole_starter, tmp_path / 'run', num_train_steps=150,
         resume=True)
  again = tf.train.load_checkpoint(path)
  for name, value in targets.items():
    assert (again.get_tensor(name) == value).all(), name


@pytest.mark.parametrize('kwargs, match', [
    ({'num_train_steps': 0}, 'num_train_steps must be a positive integer'),
    ({'batch_size': -1}, 'batch_size'),
    ({'resume': True, 'overwrite': True}, 'exclude each other'),
    ({'agent': 'ppo'}, "unknown agent 'ppo'"),
    ({'agent': 'sac'}, "'sac' needs a continuous action"),
])
def test_bad_arguments(cartpole_starter, tmp_path, kwargs, match):
  with pytest.raises(ValueError, match=match):
    _train(cartpole_starter, tmp_path / 'run', **kwargs)


def _scalars(directory):
  """`{tag: {step: value}}` of every event file under `directory`."""
  found = {}
  for path in glob.glob(os.path.join(str(directory), 'events.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        number = (value.simple_value if value.HasField('simple_value') else
                  float(tf.make_ndarray(value.tensor)))
        found.setdefault(value.tag, {})[event.step] = number
  return found


def test_tensorboard_holds_tf_agents_collect_and_eval_metrics(
    cartpole_starter, tmp_path):
  result = _train(cartpole_starter, tmp_path / 'run', eval_episodes=2,
                  eval_interval=100)
  # One event file in train/: TensorBoard polls only a directory's newest.
  assert len(glob.glob(str(tmp_path / 'run' / 'train' / 'events.*'))) == 1
  train = _scalars(tmp_path / 'run' / 'train')
  for tag in ('Metrics/AverageReturn', 'Metrics/AverageEpisodeLength',
              'Metrics/EnvironmentSteps', 'Metrics/NumberOfEpisodes',
              'Metrics/EnvironmentStepsPerSecond', 'train_steps_per_sec',
              'buffer/items', 'buffer/sample_to_insert_ratio',
              'buffer/insert_blocked_s', 'eval/AverageReturn',
              'eval/AverageEpisodeLength'):
    assert tag in train, sorted(train)
  # At train steps: after each 50-step training phase.
  env_steps = train['Metrics/EnvironmentSteps']
  assert set(env_steps) == {50, 100, 150, 200}, env_steps
  assert env_steps[200] == 200  # 4 collect phases of 50 steps.
  assert sorted(env_steps.values()) == [env_steps[s] for s in sorted(env_steps)]
  assert set(train['buffer/items']) == {50, 100, 150, 200}
  assert train['buffer/items'][200] == result.items
  # The agent's own summaries share the file.
  assert any(tag.startswith('Losses/') for tag in train), sorted(train)
  evaluations = _scalars(tmp_path / 'run' / 'eval')
  returns = evaluations['Metrics/AverageReturn']
  assert set(returns) == {100, 200}, returns  # every 100 steps, and the end
  assert returns[200] == pytest.approx(result.greedy_return)
  assert 'Metrics/AverageEpisodeLength' in evaluations
  assert train['eval/AverageReturn'] == pytest.approx(returns)
  assert set(train['eval/AverageEpisodeLength']) == {100, 200}


def test_summaries_at_a_last_step_off_the_iteration_grid(cartpole_starter,
                                                         tmp_path):
  """120 steps in phases of 50: the last phase (20 steps) is summarized too,
  and every tag has one point per step."""
  _train(cartpole_starter, tmp_path / 'run', num_train_steps=120)
  points = {}
  for path in glob.glob(str(tmp_path / 'run' / 'train' / 'events.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        points.setdefault(value.tag, []).append(event.step)
  for tag in ('Metrics/EnvironmentSteps', 'Metrics/AverageReturn',
              'buffer/items', 'buffer/samples', 'train_steps_per_sec'):
    assert points[tag] == [50, 100, 120], (tag, points[tag])


def test_progress_bar_or_log_lines(cartpole_starter, tmp_path, capsys, caplog):
  _train(cartpole_starter, tmp_path / 'bar', num_train_steps=100,
         show_progress=True)
  shown = capsys.readouterr().err
  assert 'train' in shown and '100/100' in shown and 'env_steps=' in shown
  assert 'step/s' in shown  # The rate (and the ETA beside it).
  with caplog.at_level('INFO', logger='absl'):
    _train(cartpole_starter, tmp_path / 'lines', num_train_steps=100,
           log_every_s=0.0)
  lines = [r.getMessage() for r in caplog.records
           if r.getMessage().startswith('train step ')]
  assert lines and '100/100' in lines[-1] and 'env steps' in lines[-1]
  assert 'ETA' in lines[0]


@pytest.mark.parametrize('name', ['eval_interval', 'eval_episodes'])
def test_eval_arguments_are_checked(cartpole_starter, tmp_path, name):
  with pytest.raises(ValueError, match=f'{name}.*-1'):
    _train(cartpole_starter, tmp_path / 'run', **{name: -1})


def test_one_final_pair_when_the_last_step_is_a_checkpoint_step(
    cartpole_starter, tmp_path):
  """200 steps, a pair every 100: the final save must not repeat step 200."""
  from smart_replay.integrations import paired  # pylint: disable=g-import-not-at-top
  _train(cartpole_starter, tmp_path / 'run')
  buffer_steps = paired.buffer_checkpoints(str(tmp_path / 'run' / 'buffer'))
  agent_steps = paired.agent_checkpoints(str(tmp_path / 'run' / 'agent'))
  # keep_checkpoints=2: the two newest buffer checkpoints, at 100 and 200,
  # each with its agent partner (a repeated 200 would have dropped 100).
  assert sorted(buffer_steps) == [100, 200], buffer_steps
  assert set(buffer_steps) <= set(agent_steps)


def test_a_train_config_trains_like_its_fields(cartpole_starter, tmp_path):
  config = training.TrainConfig.from_fields(
      starter_dir=cartpole_starter, run_dir=str(tmp_path / 'run'),
      num_train_steps=50, collect_steps_per_iteration=50,
      train_steps_per_iteration=50, checkpoint_every=100, eval_episodes=0)
  result = training.train_from_starter(config)
  assert result.train_step == 50 and result.run_dir == str(tmp_path / 'run')
  assert result.checkpoint.train_step == 50
  with pytest.raises(ValueError, match='TrainConfig or its fields, not both'):
    training.train_from_starter(config, seed=1)
