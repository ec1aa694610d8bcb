"""Tests for smart_replay.benchmark: the workload, and one tiny real run.

Speed targets are never asserted here (shared, noisy machines); the tiny run
only checks that every measurement is made and reported.
"""

import json

import numpy as np
import pytest

from smart_replay_benchmarks import benchmark_lib as benchmark


@pytest.mark.parametrize('field, value, message', [
    ('steps', 0, r'steps must be an integer >= 1, got 0'),
    ('observation', 'images', r"observation must be 'smooth' or 'noise'"),
    ('episode_length', 1, r'episode_length must be >= 2'),
    ('num_envs', 10_000, r'must cover at least one episode per environment'),
])
def test_bad_workload_is_refused_with_the_field(field, value, message):
  with pytest.raises(ValueError, match=message):
    benchmark.Workload(**{field: value})


@pytest.mark.parametrize('observation', ['smooth', 'noise'])
def test_steps_are_deterministic_episodes_of_the_spec(observation):
  workload = benchmark.Workload(steps=1000, repeats=1, episode_length=5,
                                observation=observation, observation_size=3)
  steps = benchmark.make_steps(workload, 0, 12)
  again = benchmark.make_steps(workload, 0, 12)
  for a, b in zip(steps, again):
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)
  assert [int(s.step_type) for s in steps] == [0, 1, 1, 1, 2] * 2 + [0, 1]
  assert [int(s.next_step_type) for s in steps] == [1, 1, 1, 2, 0] * 2 + [1, 1]
  spec = benchmark.data_spec(3)
  for step in steps:
    for leaf_spec, value in zip(spec, step):
      if leaf_spec == ():
        continue
      assert value.dtype == leaf_spec.dtype.as_numpy_dtype
      assert value.shape == tuple(leaf_spec.shape)
  assert benchmark.raw_bytes_per_step(spec) == 4 + 12 + 16 + 4 + 4 + 4
  batched = benchmark.make_steps(workload, 0, 4, num_envs=3)
  assert batched[0].observation.shape == (3, 3)
  assert batched[0].step_type.shape == (3,)


def test_a_tiny_run_measures_and_reports_everything(tmp_path):
  workload = benchmark.Workload(
      steps=400, repeats=2, observation_size=4, episode_length=10,
      num_envs=2, batch_size=8, sample_batches=3)
  results = benchmark.run(workload, str(tmp_path))
  assert set(results['ratios']) == set(benchmark.TARGETS)
  for name in ('insert', 'batched_insert', 'sample', 'checkpoint_bytes',
               'checkpoint_restore_time'):
    assert results['ratios'][name]['value'] > 0, name
  # Memory: a 400-step run may not grow the RSS at all; it is only reported.
  assert isinstance(results['ratios']['memory']['value'], float)
  for rates in results['insert_steps_per_s'].values():
    assert len(rates) == 2 and min(rates) > 0
  # Both buffers hold the same items, and restored all of them.
  checkpoint = results['checkpoint']
  assert checkpoint['ours']['items'] == checkpoint['stock']['items'] == 360
  assert checkpoint['ours']['restored_items'] == 360
  assert checkpoint['stock']['restored_items'] == 360
  assert json.loads((tmp_path / 'benchmark.json').read_text())['ratios']
  png = (tmp_path / 'benchmark.png').read_bytes()
  assert png.startswith(b'\x89PNG\r\n\x1a\n') and len(png) > 10_000
  table = benchmark.format_table(results)
  assert 'insert steps/s (1 env)' in table and 'targets:' in table
  assert not (tmp_path / 'servers').exists()  # Checkpoints are cleaned up.
