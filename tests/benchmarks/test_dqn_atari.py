"""Tests for the DQN benchmark (benchmarks/dqn_atari.py): its programs run
and their rates are read; no rate is asserted (examples/dqn_atari.py has its
own tests)."""

import subprocess

import pytest

from smart_replay_benchmarks import dqn_atari


@pytest.mark.unit
def test_rates_are_read_from_tf_agents_log_lines_after_the_first():
  log = ('I1128 learner.py:1] Step: 100, 3.210 steps/sec\n'
         'noise Step: x\n'
         'I1128 triggers.py:230] Step: 200, 11.500 steps/sec\n'
         'I1128 triggers.py:230] Step: 300, 12.250 steps/sec\n')
  assert dqn_atari.rates(log) == [11.5, 12.25]
  assert dqn_atari.rates('') == []


@pytest.mark.unit
def test_bad_settings_are_named(tmp_path):
  with pytest.raises(ValueError, match='iterations must be >= 200'):
    dqn_atari.run(str(tmp_path), iterations=100)
  with pytest.raises(ValueError, match='repeats must be >= 1, got 0'):
    dqn_atari.run(str(tmp_path), repeats=0)
  with pytest.raises(ValueError, match="side must be one of .* got 'mine'"):
    dqn_atari.command('mine', str(tmp_path), iterations=1,
                      initial_collect_steps=1, replay_capacity=1)


def test_tf_agents_own_example_runs_with_stock_reverb(tmp_path):
  # A few train steps of TF-Agents' example from its wheel (the 'ours' side
  # is examples/dqn_atari.py, which the examples' own tests run).
  args = dqn_atari.command('stock', str(tmp_path / 'root'), iterations=3,
                           initial_collect_steps=40, replay_capacity=1000)
  done = subprocess.run(args, capture_output=True, text=True, timeout=600,
                        check=False, cwd=tmp_path)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'Doing initial collect.' in done.stderr
  assert 'Training.' in done.stderr
  assert (tmp_path / 'root' / 'policies').is_dir()
  assert 'examples/dqn_atari.py' in dqn_atari.example_path()
