"""Runs the two halves of `make demo` as the Makefile does."""

import os
import subprocess
import sys

BIN = os.path.dirname(sys.executable)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


def _run(args):
  return subprocess.run(args, capture_output=True, text=True, timeout=300,
                        check=False, cwd=ROOT)


def test_make_demo_flow(tmp_path):
  populated = _run([os.path.join(BIN, 'smart-replay-populate'),
                    '--buffer_name=demo', f'--output_dir={tmp_path}',
                    '--num_runs=2', '--steps_per_run=100', '--overwrite',
                    '--quiet'])
  assert populated.returncode == 0, populated.stderr[-3000:]
  shown = _run([os.path.join(BIN, 'smart-replay-demo'),
                f'--buffer_dir={tmp_path}/demo_seq2_200steps'])
  assert shown.returncode == 0, shown.stderr[-3000:]
  assert 'loaded in a fresh process' in shown.stdout
  lines = dict(line.split(None, 1) for line in shown.stdout.splitlines()[1:])
  assert lines['items'] == '199' and lines['steps_collected'] == '200'
  assert lines['batch_shape'] == '(256, 2, 5)'


def test_demo_on_a_missing_buffer_fails_clearly(tmp_path):
  shown = _run([os.path.join(BIN, 'smart-replay-demo'),
                f'--buffer_dir={tmp_path}/none'])
  assert shown.returncode == 2
  assert 'no checkpoint to load' in shown.stderr
