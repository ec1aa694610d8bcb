"""Runs scripts/demo.py as `make demo` does, in a subprocess."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


def test_demo_script_end_to_end(tmp_path):
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'scripts', 'demo.py'),
       f'--output_dir={tmp_path}', '--steps=200', '--quiet'],
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'smart_replay demo summary' in result.stdout
  assert f'{tmp_path}/cartpole_random/checkpoints/ckpt-000001' in result.stdout


def test_demo_script_rejects_bad_steps(tmp_path):
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'scripts', 'demo.py'),
       f'--output_dir={tmp_path}', '--steps=-5', '--quiet'],
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode != 0
  assert 'steps must be a positive integer, got -5' in result.stderr
