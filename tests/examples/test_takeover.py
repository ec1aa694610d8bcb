"""examples/takeover.py: a plain TF-Agents Reverb buffer taken over."""

import re

from tests.examples import example_runner


def test_the_plain_buffer_is_imported_and_continued(tmp_path):
  result = example_runner.run('takeover', [f'--root_dir={tmp_path}/run',
                                           '--steps=300'], cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  imported = int(re.search(r'Imported (\d+) items', result.stderr).group(1))
  held = int(re.search(r'the buffer holds (\d+) items', result.stderr).group(1))
  assert imported > 250 and held > imported  # 100 more steps were written.
  assert 'Sampled a batch of observations (32, 2, 4)' in result.stderr


def test_flags(tmp_path):
  example_runner.check_flags('takeover', str(tmp_path))
