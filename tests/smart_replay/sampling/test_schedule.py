"""Tests for smart_replay.sampling.fraction_schedule (pure: no server)."""

import math

import pytest
import tensorflow as tf

from smart_replay.sampling import fraction_schedule as schedule_lib

FractionSchedule = schedule_lib.FractionSchedule
pytestmark = pytest.mark.unit


def test_fixed_fraction_ignores_the_step():
  fixed = FractionSchedule(initial=0.3)
  assert not fixed.annealed
  assert [fixed.value(s) for s in (0, 10, 10**9)] == [0.3, 0.3, 0.3]
  assert float(fixed.tensor(None)) == 0.3
  assert fixed.describe() == 'fixed 0.3'


def test_linear_anneals_then_holds():
  linear = FractionSchedule(initial=0.5, final=0.1, steps=1000)
  assert linear.value(0) == 0.5
  assert math.isclose(linear.value(500), 0.3)
  assert math.isclose(linear.value(1000), 0.1)
  assert math.isclose(linear.value(5000), 0.1)
  assert linear.describe() == 'linear 0.5 -> 0.1 over 1000 train steps'


def test_exponential_falls_by_the_same_factor_each_step():
  exponential = FractionSchedule(initial=0.8, final=0.2, steps=100,
                                 kind='exponential')
  assert math.isclose(exponential.value(50), 0.4)  # Half way: x sqrt(1/4).
  ratios = [exponential.value(s + 1) / exponential.value(s)
            for s in (0, 30, 99)]
  assert all(math.isclose(r, ratios[0]) for r in ratios)
  assert math.isclose(exponential.value(100), 0.2)


@pytest.mark.parametrize('kind', ['linear', 'exponential'])
def test_tensor_follows_the_train_step_variable(kind):
  schedule = FractionSchedule(initial=0.9, final=0.3, steps=200, kind=kind)
  step = tf.Variable(0, dtype=tf.int64)
  for value in (0, 1, 77, 200, 1000):
    step.assign(value)
    assert math.isclose(float(schedule.tensor(step)), schedule.value(value),
                        rel_tol=1e-9)


def test_annealed_needs_the_train_step():
  with pytest.raises(ValueError, match=r'linear 0.5 -> 0.1.*train_step'):
    FractionSchedule(initial=0.5, final=0.1, steps=10).tensor(None)


@pytest.mark.parametrize('kwargs, match', [
    ({'initial': 1.5}, r'FractionSchedule.initial .*\[0, 1\].*1.5'),
    ({'initial': True}, r'initial .*True'),
    ({'initial': 0.5, 'final': -0.1, 'steps': 5}, r'final .*-0.1'),
    ({'initial': 0.5, 'final': 0.1}, r'steps must be a positive .*None'),
    ({'initial': 0.5, 'final': 0.1, 'steps': 0}, r'steps .*got 0'),
    ({'initial': 0.5, 'steps': 10}, r'steps=10 needs a final'),
    ({'initial': 0.5, 'final': 0.0, 'steps': 10, 'kind': 'exponential'},
     r"exponential.*> 0.*final=0.0"),
    ({'initial': 0.5, 'kind': 'cosine'}, r"kind must be one of .*'cosine'"),
])
def test_bad_schedules_name_the_field_and_value(kwargs, match):
  with pytest.raises(ValueError, match=match):
    FractionSchedule(**kwargs)


def test_as_schedule():
  assert schedule_lib.as_schedule(None) is None
  assert schedule_lib.as_schedule(0.25) == FractionSchedule(initial=0.25)
  annealed = FractionSchedule(initial=0.5, final=0.1, steps=3)
  assert schedule_lib.as_schedule(annealed) is annealed
  with pytest.raises(ValueError, match="starter_fraction .*'half'"):
    schedule_lib.as_schedule('half')
