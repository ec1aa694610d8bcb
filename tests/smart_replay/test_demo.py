"""Tests for smart_replay.demo."""

import pytest

from smart_replay import checkpoints
from smart_replay import demo


def test_run_demo_collects_checkpoints_and_reloads(tmp_path):
  summary = demo.run_demo(output_dir=str(tmp_path), steps=300, chunk=100,
                          batch_size=8, show_progress=False)
  manifest = checkpoints.verify(summary['checkpoint'])
  counts = manifest['counts']
  assert summary['items'] == counts['tables']['experience']['items'] > 0
  assert summary['env_steps'] == counts['env_steps'] >= 300
  # Each finished CartPole episode of n steps gives n - 1 two-step items.
  assert summary['items'] == summary['env_steps'] - summary['episodes'] - (
      summary['env_steps'] > 0 and 1)
  assert summary['batch_shape'] == (8, 2, 4)
  assert 0.0 < summary['batch_mean_reward'] <= 1.0


@pytest.mark.parametrize('kwargs', [{'steps': 0}, {'chunk': 0}])
def test_run_demo_rejects_bad_numbers(tmp_path, kwargs):
  with pytest.raises(ValueError, match=list(kwargs)[0]):
    demo.run_demo(output_dir=str(tmp_path), **kwargs)
