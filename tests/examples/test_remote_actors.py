"""examples/remote_actors.py: a server, two actor processes and a learner."""

from smart_replay.storage import checkpoint_folders as checkpoints
from tests.examples import example_runner


def test_actors_and_learner_share_the_served_buffer(tmp_path):
  root = tmp_path / 'run'
  result = example_runner.run('remote_actors', [
      f'--root_dir={root}', '--num_actors=2', '--steps_per_actor=300',
      '--num_iterations=50'], cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Trained 50 steps' in result.stderr
  newest = checkpoints.verify(checkpoints.find_checkpoints(
      str(root / 'buffer'))[-1])
  # Two actors x 300 steps of CartPole: 2-step items, one fewer per episode
  # than its steps, so at least 2 x (300 - episodes) items.
  assert 400 <= newest['counts']['tables']['experience']['items'] <= 600


def test_flags(tmp_path):
  example_runner.check_flags('remote_actors', str(tmp_path))
