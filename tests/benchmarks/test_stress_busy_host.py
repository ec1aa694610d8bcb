"""benchmarks/stress_busy_host.py: a short run under load, its figures, a
bad flag."""

import json
import os
import subprocess
import sys

# The source tree (under Bazel, this file is a symlink in the runfiles): the
# script runs pytest on test files there.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__))))
SCRIPT = os.path.join(ROOT, 'benchmarks', 'stress_busy_host.py')


def _stress(*args):
  return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


def _stress_one_test(tmp_path, assertion, *args):
  """One run of a one-test file outside tests/ (no conftest loading
  TensorFlow, so the run is short); returns (result, figures path)."""
  test_file = tmp_path / 'test_one.py'
  test_file.write_text(f'def test_one():\n  {assertion}\n')
  output = tmp_path / 'stress.json'
  return _stress('--runs=1', *args, f'--files={test_file}',
                 f'--output={output}'), output


def test_one_run_under_load_writes_its_figures(tmp_path):
  result, output = _stress_one_test(tmp_path, 'assert True',
                                    '--churners=1', '--burners=1')
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'Run 1/1: passed' in result.stdout
  assert '1 of 1 runs passed' in result.stdout
  figures = json.loads(output.read_text())
  assert figures['passed'] == 1 and figures['runs'][0]['passed']
  assert figures['churners'] == 1 and figures['burners'] == 1


def test_a_missing_test_file_is_named():
  result = _stress('--files=tests/no_such_test.py')
  assert result.returncode != 0
  assert 'no such test files' in result.stderr
  assert 'tests/no_such_test.py' in result.stderr


def test_a_failed_run_keeps_its_whole_output(tmp_path):
  result, output = _stress_one_test(tmp_path, 'assert 1 == 2, "the reason"',
                                    '--churners=0', '--burners=0')
  assert result.returncode == 1
  assert 'Run 1/1: FAILED' in result.stdout
  log = tmp_path / 'stress.run1.log'
  assert f'the whole output is in {log}' in result.stdout
  assert 'the reason' in log.read_text()
  assert json.loads(output.read_text())['passed'] == 0
