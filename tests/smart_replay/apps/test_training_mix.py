"""train_from_starter with the starter mixed in ('mix') or left out ('none')."""

import json
import os
import shutil

import pytest

import smart_replay
from smart_replay.apps import experiment_report
from smart_replay.apps import training
from smart_replay.storage import checkpoint_folders as checkpoints
from tests import testing
from tests.smart_replay.apps import test_training

_train = test_training._train  # pylint: disable=protected-access
_scalars = test_training._scalars  # pylint: disable=protected-access
cartpole_starter = test_training.cartpole_starter

ANNEALED = {'starter_mode': 'mix', 'starter_fraction': 0.8,
            'starter_fraction_final': 0.2, 'starter_fraction_steps': 400}


def test_mix_leaves_the_starter_unchanged_and_checkpoints_a_reference(
    cartpole_starter, tmp_path):
  before = testing.dir_digest(cartpole_starter)
  result = _train(cartpole_starter, tmp_path / 'run', **ANNEALED)
  assert testing.dir_digest(cartpole_starter) == before
  assert result.starter_mode == 'mix' and result.items_at_start == 0
  assert result.items == result.items_collected  # The online table only.
  manifest = checkpoints.verify(result.checkpoint.buffer_checkpoint)
  assert manifest['counts']['tables']['experience']['items'] == result.items
  assert manifest['starter']['path'] == cartpole_starter
  assert manifest['starter']['items'] == result.starter_items > 0
  train = _scalars(tmp_path / 'run' / 'train')
  assert train['buffer/starter/items'][200] == result.starter_items
  assert train['buffer/starter/fraction'][200] == pytest.approx(0.5)
  # Resumed in another mode, the run is refused.
  with pytest.raises(smart_replay.StarterMismatchError,
                     match="starter_mode=mix; resume it in that mode"):
    _train(cartpole_starter, tmp_path / 'run', num_train_steps=400,
           resume=True)


def test_resume_continues_the_schedule_at_the_restored_step(
    cartpole_starter, tmp_path):
  polls = {'n': 0}

  def stop_after_two_iterations():
    polls['n'] += 1
    return polls['n'] > 2

  first = _train(cartpole_starter, tmp_path / 'run', num_train_steps=400,
                 stop_requested=stop_after_two_iterations, **ANNEALED)
  assert first.interrupted and first.train_step == 100
  moved = str(tmp_path / 'moved_starter')
  shutil.copytree(cartpole_starter, moved)  # Same content, new path.
  resumed = _train(moved, tmp_path / 'run', num_train_steps=400, resume=True,
                   **ANNEALED)
  assert resumed.resumed_from == 100 and resumed.train_step == 400
  train = _scalars(tmp_path / 'run' / 'train')
  fraction = train['buffer/starter/fraction']
  # 0.8 -> 0.2 over 400 steps: step 150 is 0.575 whether resumed or not.
  for step in (150, 200, 300, 400):
    assert fraction[step] == pytest.approx(0.8 - 0.6 * step / 400)
  # The batches drew the scheduled share (50 x 64 elements per phase; 6
  # sigma of Binomial(3200, p), plus the prefetched batches of the phase
  # before).
  sampled = train['buffer/starter/sampled_fraction']
  for step in (200, 300, 400):
    assert abs(sampled[step] - fraction[step]) < 0.08, (step, sampled[step])
  manifest = checkpoints.verify(resumed.checkpoint.buffer_checkpoint)
  assert manifest['starter']['path'] == moved


def test_resume_in_another_mode_is_refused(cartpole_starter, tmp_path):
  # A mix run resumed as a copy: in test_mix_leaves_the_starter_unchanged_...
  _train(cartpole_starter, tmp_path / 'copy', num_train_steps=50)
  with pytest.raises(smart_replay.StarterMismatchError,
                     match='written without a starter'):
    _train(cartpole_starter, tmp_path / 'copy', num_train_steps=100,
           resume=True, starter_mode='mix')


@pytest.mark.parametrize('kwargs, match', [
    ({'starter_mode': 'blend'}, "starter_mode must be one of .*'blend'"),
    ({'starter_fraction': 0.3}, "starter_fraction=0.3: only for "
                                "starter_mode='mix'"),
    ({'starter_mode': 'mix', 'starter_fraction': 2.0},
     r'starter_fraction=2.0.*\[0, 1\]'),
    ({'starter_mode': 'mix', 'starter_fraction_final': 0.1},
     'starter_fraction_steps=None'),
])
def test_bad_mixing_arguments(cartpole_starter, tmp_path, kwargs, match):
  with pytest.raises(ValueError, match=match):
    _train(cartpole_starter, tmp_path / 'run', **kwargs)
  assert not os.path.exists(tmp_path / 'run')


def test_experiment_report_reads_curves_and_draws(cartpole_starter,
                                                  tmp_path):
  runs = {}
  for mode in ('none', 'mix'):
    run_dir = tmp_path / mode
    result = _train(cartpole_starter, run_dir, starter_mode=mode,
                    eval_episodes=1, eval_interval=100)
    runs[mode] = [experiment_report.read_eval_curve(str(run_dir))]
    if mode == 'none':  # It trains on its own experience only.
      assert result.items_at_start == 0 and result.starter_items is None
      assert result.items == result.items_collected
  assert sorted(runs['mix'][0]) == [100, 200]
  report = experiment_report.Report(
      setup='cartpole', env='gym:CartPole-v1', policy='random',
      baseline_return=22.0, num_train_steps=200, eval_interval=100,
      seeds=[0], curves=runs)
  paths = experiment_report.write(report, str(tmp_path))
  assert os.path.getsize(paths['figure']) > 10_000
  table = open(paths['table']).read()
  assert '| variant | step 100 | step 200 | mean of all evaluations |' in table
  assert '| random policy (starter) | 22.0 | 22.0 | 22.0 | 22.0 |' in table
  assert json.load(open(paths['report']))['curves']['mix'][0]['200'] >= 0
  assert training.MODES == ('copy', 'mix', 'none')
