"""Tests for smart_replay.apps.populate (the library function)."""

import json
import logging
import os

import gin
import pytest

import smart_replay
from smart_replay.apps import populate
from smart_replay.storage import checkpoint_folders as checkpoints


def _populate(tmp_path, **kwargs):
  kwargs.setdefault('buffer_name', 'office')
  kwargs.setdefault('output_dir', str(tmp_path))
  kwargs.setdefault('steps_per_run', 288)
  kwargs.setdefault('num_runs', 3)
  kwargs.setdefault('show_progress', False)
  return populate.populate_starter_buffer(**kwargs)


def _load(buffer_dir):
  manager = smart_replay.ReplayBufferManager.from_checkpoint(buffer_dir)
  manager.load_replay_buffer()
  return manager


def test_populate_then_load_counts_match_steps_and_runs(tmp_path):
  result = _populate(tmp_path)
  assert result.buffer_dir == str(tmp_path / 'office_seq2_864steps')
  assert (result.steps, result.runs, result.total_steps) == (864, 3, 864)
  # Three simulated days; the third day's boundary step is not reached.
  assert result.episodes == 2
  assert result.items == 863  # 288 + 288 + 287 two-step windows.
  assert [os.path.basename(p) for p in checkpoints.find_checkpoints(
      result.buffer_dir)] == ['ckpt-000003', 'ckpt-000002']  # Keep last 2.
  with _load(result.buffer_dir) as manager:
    assert manager.num_frames() == result.items
    assert manager.loaded_manifest['extra']['populate'] == {
        'steps': 864, 'episodes': 2, 'runs': 3, 'total_steps': 864,
        'env': 'thermal', 'policy': 'baseline',
        'policy_class': 'SchedulePolicy'}
    trajectory, _ = next(iter(manager.get_dataset(batch_size=16)))
    assert trajectory.observation.shape == [16, 2, 5]


def test_provenance_records_what_ran(tmp_path):
  with gin.unlock_config():
    gin.parse_config('ThermalZoneEnv.outdoor_mean = 3.0')
  try:
    result = _populate(tmp_path, seed=7, num_runs=2)
  finally:
    gin.clear_config()
  with open(result.provenance) as f:
    record = json.load(f)
  assert record['env'] == 'thermal' and record['policy'] == 'baseline'
  assert record['policy_class'] == 'SchedulePolicy' and record['seed'] == 7
  assert record['steps_collected'] == 576 == record['total_steps_requested']
  assert record['episodes_collected'] == 1 and record['runs_completed'] == 2
  assert record['complete'] and not record['interrupted']
  assert record['items'] == result.items and record['evicted_items'] == 0
  assert 'ThermalZoneEnv.outdoor_mean = 3.0' in record['gin_config']
  assert 'populate_starter_buffer.' in record['gin_config']
  assert record['versions']['dm-reverb'] == '0.14.0'
  assert [l['path'] for l in record['data_spec']][:3] == [
      'step_type', 'observation', 'action']
  (session,) = record['sessions']
  assert session['steps'] == 576 and session['seconds'] > 0
  assert session['checkpoint'] == result.checkpoint


def test_existing_buffer_is_refused_unless_overwrite(tmp_path):
  first = _populate(tmp_path, num_runs=1)
  with pytest.raises(smart_replay.CheckpointExistsError,
                     match='resume=True.*overwrite=True'):
    _populate(tmp_path, num_runs=1)
  second = _populate(tmp_path, num_runs=1, overwrite=True, seed=5)
  assert second.buffer_dir == first.buffer_dir
  assert [os.path.basename(p) for p in checkpoints.find_checkpoints(
      second.buffer_dir)] == ['ckpt-000001']
  with pytest.raises(ValueError, match='overwrite and resume'):
    _populate(tmp_path, num_runs=1, overwrite=True, resume=True)


def test_interrupted_run_loads_and_resume_reaches_the_total(tmp_path):
  calls = {'n': 0}

  def stop_after_400_steps():
    calls['n'] += 1
    return calls['n'] >= 400

  partial = _populate(tmp_path, stop_requested=stop_after_400_steps)
  assert partial.interrupted
  # The callback is polled per trajectory and once per run: 398 trajectories,
  # day 1 (288 steps + its boundary) and 109 steps of day 2.
  assert (partial.steps, partial.runs, partial.items) == (397, 1, 396)
  with _load(partial.buffer_dir) as manager:  # The interrupted buffer loads.
    assert manager.num_frames() == partial.items > 0
  resumed = _populate(tmp_path, resume=True)
  assert not resumed.interrupted
  assert (resumed.steps, resumed.runs) == (864, 3)  # Exactly the total.
  # The new session runs one Actor: a whole day (288 + boundary), then 179
  # steps of the next until the total. No short fake day in between.
  assert resumed.episodes == 2 and resumed.items == 396 + 288 + 178
  with open(resumed.provenance) as f:
    record = json.load(f)
  first, second = record['sessions']
  assert first['steps'] + second['steps'] == 864
  assert second['resumed'] and first['seed'] != second['seed']
  assert record['complete']
  # Resuming a complete buffer collects nothing more.
  again = _populate(tmp_path, resume=True)
  assert again.steps == 864 and again.items == resumed.items


def test_resume_to_a_larger_total_continues_the_same_buffer(tmp_path):
  first = _populate(tmp_path, num_runs=1)
  more = _populate(tmp_path, num_runs=3, resume=True)
  assert more.buffer_dir == str(tmp_path / 'office_seq2_864steps')
  assert os.listdir(tmp_path) == ['office_seq2_864steps']  # Renamed, not new.
  assert not os.path.exists(first.buffer_dir)
  with open(more.provenance) as f:
    sessions = json.load(f)['sessions']
  assert [s['steps'] for s in sessions] == [288, 576]
  assert more.steps == 864


def test_resume_without_a_buffer_warns_and_starts(tmp_path, caplog):
  with caplog.at_level(logging.WARNING):
    result = _populate(tmp_path, num_runs=1, resume=True)
  assert result.steps == 288
  assert any('no buffer named' in r.getMessage() for r in caplog.records)


def test_resume_with_another_policy_is_refused_and_nothing_moves(tmp_path):
  _populate(tmp_path, num_runs=1)
  with pytest.raises(ValueError, match=r"policy_class: buffer='SchedulePolicy', "
                     r"now='RandomPyPolicy'"):
    _populate(tmp_path, num_runs=2, resume=True, policy='random')
  assert os.listdir(tmp_path) == ['office_seq2_288steps']  # Name restored.


def test_a_stop_requested_between_runs_adds_no_checkpoint(tmp_path):
  buffer_dir = tmp_path / 'office_seq2_864steps'
  result = _populate(tmp_path, stop_requested=lambda: os.path.exists(
      buffer_dir / 'checkpoints' / 'ckpt-000001'))
  assert result.interrupted and result.steps == 288
  assert [os.path.basename(p) for p in checkpoints.find_checkpoints(
      str(buffer_dir))] == ['ckpt-000001']
  with open(result.provenance) as f:
    record = json.load(f)
  assert record['interrupted'] and record['steps_collected'] == 288


def test_stop_request_second_signal_quits():
  from smart_replay.apps import cli  # pylint: disable=g-import-not-at-top
  stop = cli.StopRequest()
  assert not stop()
  stop.handle(15)
  assert stop() and stop.signal == 15
  with pytest.raises(KeyboardInterrupt):
    stop.handle(2)
  assert stop.signal == 15


def test_short_episodes_are_reported(tmp_path, caplog):
  with caplog.at_level(logging.WARNING):
    result = _populate(tmp_path, env='gym:CartPole-v1', policy='random',
                       sequence_length=60, steps_per_run=150, num_runs=2)
  assert result.items < 20
  with open(result.provenance) as f:
    record = json.load(f)
  assert record['short_episodes_this_session'] > 5
  assert any('shorter than sequence_length=60' in r.getMessage()
             for r in caplog.records)


def test_resume_with_other_settings_lists_differences(tmp_path):
  _populate(tmp_path, num_runs=1)
  with pytest.raises(smart_replay.ManifestMismatchError,
                     match='capacity: checkpoint=50000, requested=1000'):
    _populate(tmp_path, num_runs=1, resume=True, capacity=1000)


def test_full_buffer_is_announced(tmp_path, caplog):
  with caplog.at_level(logging.WARNING):
    result = _populate(tmp_path, capacity=100, steps_per_run=150, num_runs=2)
  messages = ' '.join(r.getMessage() for r in caplog.records)
  assert 'only 100 of capacity 100 are free' in messages  # Up front,
  assert 'The buffer is full (100 items = capacity)' in messages  # when full,
  with open(result.provenance) as f:
    record = json.load(f)
  assert result.items == 100 and record['evicted_items'] > 150  # and after.


def test_cartpole_with_random_and_scripted_policies(tmp_path):
  scripted = _populate(tmp_path, buffer_name='cp', env='gym:CartPole-v1',
                       steps_per_run=200, num_runs=2)
  random = _populate(tmp_path, buffer_name='cpr', env='gym:CartPole-v1',
                     policy='random', steps_per_run=200, num_runs=2)
  assert scripted.steps == random.steps == 400
  assert random.episodes > 3 * max(scripted.episodes, 1)
  with _load(scripted.buffer_dir) as manager:
    trajectory, _ = next(iter(manager.get_dataset(batch_size=8)))
    assert trajectory.observation.shape == [8, 2, 4]


@pytest.mark.parametrize('kwargs, match', [
    ({'buffer_name': 'a/b'}, "buffer_name 'a/b' is not a plain name"),
    ({'buffer_name': '..'}, 'not a plain name'),
    ({'buffer_name': ''}, 'not a plain name'),
    ({'capacity': -5}, 'capacity must be a positive integer, got -5'),
    ({'sequence_length': 0}, 'sequence_length must be a positive integer'),
    ({'env': 'gym:Nope-v9'}, "unknown Gym environment id 'Nope-v9'"),
    ({'policy': 'clever'}, "unknown policy 'clever'"),
])
def test_bad_arguments_are_named(tmp_path, kwargs, match):
  with pytest.raises(ValueError, match=match):
    _populate(tmp_path, **kwargs)
  assert not os.listdir(tmp_path)  # Nothing was created.


def test_counts_agree_in_summary_provenance_stats_and_inspect(tmp_path):
  """One definition per count (smart_replay.writing.counters), printed in the
  same words: env steps exclude episode boundaries, episodes are finished
  ones, items are the table's."""
  from smart_replay.tools import inspection  # pylint: disable=g-import-not-at-top
  result = populate.populate_starter_buffer(
      buffer_name='cp', output_dir=str(tmp_path), env='gymnasium:CartPole-v1',
      policy='random', steps_per_run=300, num_runs=2, show_progress=False)
  assert result.episodes > 5  # CartPole episodes end: boundaries were seen
  counts = (f'600 env steps, {result.episodes:,} finished episodes, '
            f'{result.items:,} items')
  record = json.loads(open(result.provenance).read())
  assert (record['env_steps'], record['requested_env_steps']) == (600, 600)
  assert (record['episodes'], record['items'], record['runs']) == (
      result.episodes, result.items, 2)
  assert record['complete'] and not record['interrupted']
  assert record['steps_collected'] == record['env_steps_written'] == 600
  assert record['episodes_collected'] == result.episodes  # Older names.
  description = inspection.describe(result.buffer_dir)
  assert description['env_steps'] == 600
  assert description['episodes'] == result.episodes
  table = description['tables']['experience']
  assert table['items'] == result.items
  assert table['item_episodes'] == result.episodes + 1  # Reverb's: + open one
  text = inspection.format_text(description)
  assert f'  {counts}\n  complete: 600 of 600 requested env steps\n' in text
  assert 'steps_collected' not in text  # Older names are not repeated.
  assert result.summary().startswith(
      f'Populated {result.buffer_dir}: {counts}, 2 runs.\n'
      '  complete: 600 of 600 requested env steps\n')
  with _load(result.buffer_dir) as manager:
    stats = manager.stats()
    assert stats['env_steps'] == 600 and stats['episodes'] == result.episodes
    table = stats['tables']['experience']
    assert table['item_episodes'] == result.episodes + 1
    assert manager.num_frames() == table['items'] == table['stored_items'] \
        == result.items


def test_an_interrupted_buffer_says_what_it_holds(tmp_path):
  """The directory keeps the requested total in its name; the provenance,
  the summary and inspect say how much of it the buffer holds."""
  from smart_replay.tools import inspection  # pylint: disable=g-import-not-at-top
  buffer_dir = tmp_path / 'office_seq2_864steps'
  result = _populate(tmp_path, stop_requested=lambda: os.path.exists(
      buffer_dir / 'checkpoints' / 'ckpt-000001'))
  assert result.interrupted and result.buffer_dir == str(buffer_dir)
  record = json.loads(open(result.provenance).read())
  assert (record['env_steps'], record['requested_env_steps']) == (288, 864)
  assert not record['complete'] and record['interrupted']
  state = ('interrupted: 288 of 864 requested env steps (the directory keeps '
           'the requested total in its name; smart-replay-populate --resume '
           'continues it)')
  assert f'\n  {state}\n' in inspection.format_text(
      inspection.describe(result.buffer_dir))
  summary = result.summary()
  assert summary.startswith(
      f'Interrupted: collected 288 env steps, {result.episodes} finished '
      f'episodes, {result.items} items, 1 run in {buffer_dir}.\n')
  assert f'\n  {state}\n' in summary
