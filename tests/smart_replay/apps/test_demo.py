"""Tests for smart_replay.apps.demo."""

import pytest

import smart_replay
from smart_replay.apps import demo
from smart_replay.apps import populate
from tests import testing


@pytest.fixture(scope='module')
def starter(tmp_path_factory):
  return populate.populate_starter_buffer(
      buffer_name='demo', output_dir=str(tmp_path_factory.mktemp('starters')),
      steps_per_run=288, num_runs=2, show_progress=False)


def test_summary_describes_the_buffer_without_touching_it(starter):
  before = testing.dir_digest(starter.buffer_dir)
  summary = demo.summarize_buffer(starter.buffer_dir, batch_size=64)
  assert testing.dir_digest(starter.buffer_dir) == before
  assert summary['checkpoint'] == starter.checkpoint
  assert summary['items'] == starter.items == 575
  assert summary['steps_collected'] == starter.steps == 576
  assert summary['episodes'] == starter.episodes == 1
  assert summary['batch_shape'] == (64, 2, 5)
  assert summary['policy_class'] == 'SchedulePolicy'
  # The schedule policy keeps comfort: the mean per-step cost is small.
  assert -0.2 < summary['sampled_mean_reward'] < 0


def test_missing_buffer_is_reported(tmp_path):
  with pytest.raises(smart_replay.CheckpointNotFoundError,
                     match=str(tmp_path / 'nothing')):
    demo.summarize_buffer(str(tmp_path / 'nothing'))
