"""The mixing experiment script, end to end at a tiny size."""

import json
import os
import subprocess
import sys

from smart_replay.apps import experiment_report
from smart_replay.apps import mixing_experiment

EXPERIMENT = os.path.join(os.path.dirname(sys.executable),
                          'smart-replay-experiment')


def _run(*args, cwd):
  return subprocess.run([EXPERIMENT, *args], capture_output=True, text=True,
                        timeout=900, check=False, cwd=cwd)


def test_every_variant_runs_reports_and_resumes(tmp_path):
  args = ('--setup=cartpole', '--seeds=0', '--num_train_steps=100',
          f'--output_dir={tmp_path}')
  first = _run(*args, cwd=str(tmp_path))
  assert first.returncode == 0, first.stderr[-3000:]
  root = tmp_path / 'cartpole'
  report = json.load(open(root / 'report.json'))
  assert list(report['curves']) == list(mixing_experiment.VARIANTS)
  assert all(list(c[0]) == ['100'] for c in report['curves'].values())
  assert report['baseline_return'] > 100  # The scripted CartPole policy.
  assert os.path.getsize(root / 'cartpole.png') > 10_000
  assert '| fixed 50/50 mix |' in first.stdout
  for variant in mixing_experiment.VARIANTS:
    run = root / mixing_experiment.slug(variant) / 'seed0'
    assert json.load(open(run / 'result.json'))['train_step'] == 100
  # Run again: every run is done, nothing trains.
  again = _run(*args, cwd=str(tmp_path))
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stderr.count('done already') == len(mixing_experiment.VARIANTS)
  assert experiment_report.table_steps(100, 500) == [100]


def test_bad_flags_exit_2(tmp_path):
  for flag in ('--setup=pong', '--seeds=a,b'):
    result = _run('--setup=cartpole', flag, f'--output_dir={tmp_path}',
                  cwd=str(tmp_path))
    assert result.returncode == 2, (flag, result.stderr[-2000:])
    assert len(result.stderr.strip().splitlines()) <= 2, result.stderr
