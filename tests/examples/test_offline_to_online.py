"""examples/offline_to_online.py: the starter mixed into every batch."""

import re

from smart_replay.storage import checkpoint_folders as checkpoints
from tests.examples import example_runner


def test_both_sources_feed_the_batches(tmp_path):
  root = tmp_path / 'run'
  result = example_runner.run('offline_to_online', [
      f'--root_dir={root}', '--starter_steps=300', '--num_iterations=60'],
                              cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  online, starter = map(int, re.search(
      r'Sampled (\d+) elements from the online buffer and (\d+) from the '
      r'starter', result.stderr).groups())
  assert online > 0 and starter > 0
  newest = checkpoints.verify(checkpoints.find_checkpoints(
      str(root / 'buffer'))[-1])
  assert newest['starter']['path'].endswith('starter')


def test_flags(tmp_path):
  example_runner.check_flags('offline_to_online', str(tmp_path))
