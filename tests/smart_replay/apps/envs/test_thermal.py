"""Tests for the thermal zone: a real PyEnvironment that behaves physically."""

import math

import numpy as np
import pytest
from tf_agents.environments import utils as env_utils
from tf_agents.trajectories import StepType

from smart_replay.apps.envs import thermal
from smart_replay.apps.policies import thermostat


def _run_day(env, act):
  """Runs one episode; returns indoor temperatures at each step start, rewards."""
  time_step = env.reset()
  temps, rewards, steps = [float(time_step.observation[0])], [], [time_step]
  while not time_step.is_last():
    time_step = env.step(act(time_step))
    temps.append(float(time_step.observation[0]))
    rewards.append(float(time_step.reward))
    steps.append(time_step)
  return np.array(temps), np.array(rewards), steps


def test_is_a_valid_tf_agents_environment():
  env_utils.validate_py_environment(thermal.ThermalZoneEnv(seed=3), episodes=2)


def test_one_day_of_five_minute_steps_ends_by_truncation():
  env = thermal.ThermalZoneEnv(seed=0)
  _, rewards, steps = _run_day(env, lambda _: np.zeros(1, np.float32))
  assert len(rewards) == 288 == env.steps_per_episode
  assert steps[-1].step_type == StepType.LAST
  assert steps[-1].discount == 1.0  # A time limit, not a terminal state.
  assert steps[0].observation.dtype == np.float32


def test_step_is_the_exact_rc_solution():
  env = thermal.ThermalZoneEnv(outdoor_noise=0.0)
  tau_h = 2.0 * 1.0
  got = env.next_indoor_temperature(20.0, 5.0, hvac_kw=3.0, occupied=True)
  equilibrium = 5.0 + 2.0 * (3.0 + 1.0)
  want = equilibrium + (20.0 - equilibrium) * math.exp(-(5 / 60) / tau_h)
  assert got == pytest.approx(want)


def test_outdoor_cycle_is_coldest_at_3_and_warmest_at_15():
  env = thermal.ThermalZoneEnv(outdoor_mean=8.0, outdoor_amplitude=6.0)
  assert env.outdoor_temperature(3.0) == pytest.approx(2.0)
  assert env.outdoor_temperature(15.0) == pytest.approx(14.0)
  assert env.outdoor_temperature(9.0) == pytest.approx(8.0)


def _one_step_reward(hour, u, *, indoor, **kwargs):
  """Reward of one step taken at `hour` from `indoor` °C (no noise)."""
  env = thermal.ThermalZoneEnv(outdoor_noise=0.0,
                               initial_temperature=(indoor, indoor), **kwargs)
  env.reset()
  env._indoor = indoor  # pylint: disable=protected-access
  for _ in range(int(hour * 12)):
    env.step(np.zeros(1, np.float32))
    env._indoor = indoor  # pylint: disable=protected-access
  return float(env.step(np.full(1, u, np.float32)).reward), env


def test_reward_is_energy_cost_plus_comfort_cost_exactly():
  dt = 5 / 60
  # 09:00, peak price 0.30, full heating (10 kW thermal, COP 3), comfortable.
  reward, env = _one_step_reward(9.0, 1.0, indoor=21.5)
  indoor = env.next_indoor_temperature(21.5, env.outdoor_temperature(9.0),
                                       10.0, True)
  violation = max(21.0 - indoor, 0) + max(indoor - 24.0, 0)
  assert violation == 0
  assert reward == pytest.approx(-0.30 * 10 / 3 * dt)
  # 02:00, off-peak 0.15, half cooling, below the 16 °C setback band.
  reward, env = _one_step_reward(2.0, -0.5, indoor=15.0)
  indoor = env.next_indoor_temperature(15.0, env.outdoor_temperature(2.0),
                                       -5.0, False)
  assert reward == pytest.approx(-(0.15 * 5 / 3 * dt + (16.0 - indoor) * dt))
  # 12:00, occupied, HVAC off, too warm: only the comfort term, weighted.
  reward, env = _one_step_reward(12.0, 0.0, indoor=26.0, comfort_weight=2.0)
  indoor = env.next_indoor_temperature(26.0, env.outdoor_temperature(12.0),
                                       0.0, True)
  assert reward == pytest.approx(-2.0 * (indoor - 24.0) * dt)


def test_without_hvac_the_zone_drifts_toward_outdoor():
  env = thermal.ThermalZoneEnv(outdoor_noise=0.0, initial_temperature=(25, 25),
                               internal_gain_kw=0.0, outdoor_amplitude=0.0,
                               outdoor_mean=5.0)
  temps, _, _ = _run_day(env, lambda _: np.zeros(1, np.float32))
  gaps = np.abs(temps - 5.0)
  assert (np.diff(gaps) < 0).all()  # Monotonic approach, no overshoot.
  assert gaps[-1] < 0.01 * gaps[0]  # 24 h = 12 time constants.


def test_heating_warms_and_cooling_cools():
  def final(u):
    env = thermal.ThermalZoneEnv(outdoor_noise=0.0, seed=1)
    return _run_day(env, lambda _: np.full(1, u, np.float32))[0][-1]
  assert final(1.0) > final(0.0) + 15 > final(-1.0) + 30


def test_schedule_policy_reaches_and_holds_the_setpoint():
  env = thermal.ThermalZoneEnv(seed=2)
  policy = thermostat.SchedulePolicy(env.time_step_spec(), env.action_spec())
  temps, rewards, _ = _run_day(env, lambda t: policy.action(t).action)
  assert temps[0] < 20  # The night starts cold...
  at = lambda hour: temps[int(hour * 12)]
  assert 21.0 <= at(8.0) <= 24.0  # ...and the zone is comfortable at 08:00,
  occupied = temps[8 * 12:18 * 12]
  assert np.abs(occupied - 22.5).mean() < 0.5  # held near the setpoint,
  assert occupied.min() > 21.0
  assert 15.0 < at(23.0) < 18.0  # then set back at night.
  off_rewards = _run_day(thermal.ThermalZoneEnv(seed=2),
                         lambda _: np.zeros(1, np.float32))[1]
  assert rewards.sum() > off_rewards.sum()  # Comfort is worth the energy.


def test_hour_is_recovered_from_the_observation():
  env = thermal.ThermalZoneEnv()
  time_step = env.reset()
  for _ in range(7 * 12 + 6):  # 07:30
    time_step = env.step(np.zeros(1, np.float32))
  assert thermal.hour_from_observation(time_step.observation) == pytest.approx(
      7.5, abs=1e-4)
  assert time_step.observation[4] == 0.0
  for _ in range(6):
    time_step = env.step(np.zeros(1, np.float32))
  assert time_step.observation[4] == 1.0  # Occupied from 08:00.


@pytest.mark.parametrize('kwargs, field', [
    ({'resistance': 0}, 'resistance'),
    ({'capacitance': -1}, 'capacitance'),
    ({'occupied_hours': (18, 8)}, 'occupied_hours'),
    ({'comfort_band': (24, 21)}, 'comfort_band'),
    ({'step_minutes': 7}, 'step_minutes'),
    ({'outdoor_noise': -0.1}, 'outdoor_noise'),
])
def test_bad_parameters_are_named(kwargs, field):
  with pytest.raises(ValueError, match=field):
    thermal.ThermalZoneEnv(**kwargs)
