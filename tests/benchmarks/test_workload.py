"""Tests for smart_replay_benchmarks.workload: settings, spec and steps."""

import numpy as np
import pytest

from smart_replay_benchmarks import workload as workload_lib

pytestmark = pytest.mark.unit


@pytest.mark.parametrize('field, value, message', [
    ('steps', 0, r'steps must be an integer >= 1, got 0'),
    ('observation', 'images', r"observation must be 'smooth' or 'noise'"),
    ('episode_length', 1, r'episode_length must be >= 2'),
    ('num_envs', 10_000, r'must cover at least one episode per environment'),
    ('observation_dtype', 'float16', r"observation_dtype must be one of "
     r"\('float32', 'uint8'\), got 'float16'"),
    ('observation_shape', (84, 0), r'observation_shape must be a tuple of '
     r'integers >= 1, got \(84, 0\)'),
])
def test_bad_workload_is_refused_with_the_field(field, value, message):
  with pytest.raises(ValueError, match=message):
    workload_lib.Workload(**{field: value})


@pytest.mark.parametrize('observation', ['smooth', 'noise'])
def test_steps_are_deterministic_episodes_of_the_spec(observation):
  workload = workload_lib.Workload(
      steps=1000, repeats=1, episode_length=5, observation=observation,
      observation_size=3)
  steps = workload_lib.make_steps(workload, 0, 12)
  again = workload_lib.make_steps(workload, 0, 12)
  for a, b in zip(steps, again):
    for x, y in zip(a, b):
      assert np.array_equal(x, y)
  assert [int(s.step_type) for s in steps] == [0, 1, 1, 1, 2] * 2 + [0, 1]
  assert [int(s.next_step_type) for s in steps] == [1, 1, 1, 2, 0] * 2 + [1, 1]
  spec = workload_lib.data_spec(3)
  for step in steps:
    for leaf_spec, value in zip(spec, step):
      if leaf_spec == ():
        continue
      assert value.dtype == leaf_spec.dtype.as_numpy_dtype
      assert value.shape == tuple(leaf_spec.shape)
  assert workload_lib.raw_bytes_per_step(spec) == 4 + 12 + 16 + 4 + 4 + 4
  batched = workload_lib.make_steps(workload, 0, 4, num_envs=3)
  assert batched[0].observation.shape == (3, 3)
  assert batched[0].step_type.shape == (3,)


def test_image_like_steps_are_uint8_of_the_shape():
  workload = workload_lib.Workload(
      steps=1000, repeats=1, episode_length=5, observation_shape=(6, 6, 4),
      observation_dtype='uint8')
  step = workload_lib.make_steps(workload, 0, 3)[2]
  assert step.observation.dtype == np.uint8
  assert step.observation.shape == (6, 6, 4)
  assert len(np.unique(step.observation)) > 10  # Not saturated.
  assert workload.describe_observation() == 'uint8[6, 6, 4] smooth'
  assert workload_lib.raw_bytes_per_step(workload.spec) == 144 + 16 + 16


def test_buffers_store_the_benchmark_table_in_their_layout():
  spec = workload_lib.data_spec(3)
  blocks = workload_lib.BUFFERS['blocks']
  assert blocks.table(100).block_length == workload_lib.BLOCK_LENGTH
  assert blocks.step_layout(spec).num_columns == 1
  assert workload_lib.BUFFERS['stock'].step_layout(spec).num_columns == 6
