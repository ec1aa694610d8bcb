"""examples/dqn_cartpole_starter.py: a short run, as a user runs it."""

import os

from smart_replay.storage import checkpoint_folders as checkpoints
from tests.examples import example_runner


def test_a_short_run_trains_from_the_starter(tmp_path):
  root = tmp_path / 'run'
  result = example_runner.run('dqn_cartpole_starter', [
      f'--root_dir={root}', '--starter_steps=300', '--num_iterations=50',
      '--eval_episodes=2'], cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Average return after 50 iterations' in result.stderr
  starter = checkpoints.verify(checkpoints.find_checkpoints(
      str(root / 'starter'))[-1])
  trained = checkpoints.verify(checkpoints.find_checkpoints(
      str(root / 'buffer'))[-1])
  assert starter['counts']['env_steps'] == 300
  # The run continued the starter's items with 50 collected steps.
  assert trained['counts']['env_steps'] == 350
  assert trained['extra'] == {'train_step': 50}
  assert os.listdir(root / 'train')


def test_flags(tmp_path):
  example_runner.check_flags('dqn_cartpole_starter', str(tmp_path))
