"""A single-zone building thermal environment (first-order RC model).

The zone is one thermal capacitance `C` (kWh/°C) coupled to the outdoor air
through one resistance `R` (°C/kW)::

    C · dT_in/dt = (T_out(t) − T_in) / R + Q_hvac + Q_internal(t)

* `T_out(t)` follows a daily cycle, `mean + amplitude · sin(2π (h − 9) / 24)`
  (coldest at 03:00, warmest at 15:00), plus a little seeded noise.
* `Q_hvac = u · max_power_kw` is the thermal power of the HVAC, with the action
  `u ∈ [−1, 1]` (positive heats, negative cools).
* `Q_internal` is the heat given off by occupants and equipment while the zone
  is occupied (`occupied_hours`, e.g. 08:00–18:00).

Over one time step `dt` with constant inputs the equation has the exact
solution `T' = T_eq + (T − T_eq) · exp(−dt / (R C))`, where
`T_eq = T_out + R (Q_hvac + Q_internal)`; the environment uses it, so the
model is stable for any step size.

Reward per step (negative cost)::

    − price(h) · |Q_hvac| / cop · dt_h  −  comfort_weight · violation · dt_h

where `violation` is how far (°C) `T_in` is outside the comfort band: the
occupied band during occupied hours, the wider setback band otherwise; `price`
is a time-of-use tariff.

Observation (float32[5]): indoor temperature, outdoor temperature, sin and cos
of the hour of day, occupied flag. Action: float32[1] in [−1, 1]. An episode is
one day from midnight (288 steps of 5 minutes by default); it ends by
truncation (LAST step with discount 1), since the building goes on.
"""

import math
from typing import Tuple

import gin
import numpy as np
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

OBSERVATION_FIELDS = ('indoor_temperature', 'outdoor_temperature', 'hour_sin',
                      'hour_cos', 'occupied')


def hour_from_observation(observation: np.ndarray) -> float:
  """Recovers the hour of day (0 <= h < 24) from an observation.

  Args:
    observation: a ThermalZoneEnv observation.

  Returns:
    The hour of day.
  """
  angle = math.atan2(float(observation[2]), float(observation[3]))
  return (angle / (2 * math.pi) * 24) % 24


@gin.configurable
class ThermalZoneEnv(py_environment.PyEnvironment):
  """One building zone heated and cooled by an HVAC unit (see module doc).

  Args:
    resistance: R, °C per kW of heat flow to the outdoor air (> 0).
    capacitance: C, kWh per °C (> 0); R·C is the time constant in hours.
    max_power_kw: thermal power of the HVAC at |u| = 1 (> 0).
    internal_gain_kw: heat from occupancy while occupied (>= 0).
    cop: coefficient of performance (thermal kW per electric kW, > 0).
    outdoor_mean: mean outdoor temperature, °C.
    outdoor_amplitude: half the daily outdoor swing, °C (>= 0).
    outdoor_noise: std of the per-step outdoor noise, °C (>= 0).
    occupied_hours: (start, end) hours of occupancy, 0 <= start < end <= 24.
    comfort_band: (low, high) °C while occupied.
    setback_band: (low, high) °C while unoccupied.
    comfort_weight: cost per °C·h outside the band.
    peak_price: energy price per kWh from 08:00 to 20:00.
    offpeak_price: energy price per kWh otherwise.
    step_minutes: time step in minutes; must divide 24 h.
    initial_temperature: (low, high) range of the indoor temperature at
      midnight, drawn uniformly per episode.
    seed: seed of the initial temperature and outdoor noise.

  Raises:
    ValueError: on a parameter outside its range; the message names it.
  """

  def __init__(self, *, resistance: float = 2.0, capacitance: float = 1.0,
               max_power_kw: float = 10.0, internal_gain_kw: float = 1.0,
               cop: float = 3.0, outdoor_mean: float = 8.0,
               outdoor_amplitude: float = 6.0, outdoor_noise: float = 0.2,
               occupied_hours: Tuple[float, float] = (8.0, 18.0),
               comfort_band: Tuple[float, float] = (21.0, 24.0),
               setback_band: Tuple[float, float] = (16.0, 28.0),
               comfort_weight: float = 1.0, peak_price: float = 0.30,
               offpeak_price: float = 0.15, step_minutes: int = 5,
               initial_temperature: Tuple[float, float] = (15.0, 19.0),
               seed: int = 0):
    super().__init__()
    for name, value in (('resistance', resistance),
                        ('capacitance', capacitance),
                        ('max_power_kw', max_power_kw), ('cop', cop)):
      if not value > 0:
        raise ValueError(f'ThermalZoneEnv {name} must be > 0, got {value!r}.')
    for name, value in (('internal_gain_kw', internal_gain_kw),
                        ('outdoor_amplitude', outdoor_amplitude),
                        ('outdoor_noise', outdoor_noise),
                        ('comfort_weight', comfort_weight)):
      if value < 0:
        raise ValueError(f'ThermalZoneEnv {name} must be >= 0, got {value!r}.')
    if not 0 <= occupied_hours[0] < occupied_hours[1] <= 24:
      raise ValueError(f'ThermalZoneEnv occupied_hours must satisfy 0 <= start '
                       f'< end <= 24, got {occupied_hours!r}.')
    for name, band in (('comfort_band', comfort_band),
                       ('setback_band', setback_band),
                       ('initial_temperature', initial_temperature)):
      if not band[0] <= band[1]:
        raise ValueError(f'ThermalZoneEnv {name} must be (low, high) with low '
                         f'<= high, got {band!r}.')
    if not isinstance(step_minutes, int) or step_minutes < 1 or (
        24 * 60) % step_minutes:
      raise ValueError(f'ThermalZoneEnv step_minutes must be a positive '
                       f'divisor of 1440, got {step_minutes!r}.')
    self._r, self._c = float(resistance), float(capacitance)
    self._max_power = float(max_power_kw)
    self._internal_gain = float(internal_gain_kw)
    self._cop = float(cop)
    self._outdoor = (float(outdoor_mean), float(outdoor_amplitude),
                     float(outdoor_noise))
    self._occupied_hours = tuple(map(float, occupied_hours))
    self._comfort_band = tuple(map(float, comfort_band))
    self._setback_band = tuple(map(float, setback_band))
    self._comfort_weight = float(comfort_weight)
    self._prices = (float(peak_price), float(offpeak_price))
    self._dt_h = step_minutes / 60.0
    self._decay = math.exp(-self._dt_h / (self._r * self._c))
    self.steps_per_episode = (24 * 60) // step_minutes
    self._initial_temperature = tuple(map(float, initial_temperature))
    self._rng = np.random.default_rng(seed)
    self._step_index = 0
    self._indoor = 0.0
    self._outdoor_now = 0.0
    self._episode_ended = True
    self._observation_spec = array_spec.ArraySpec(
        (len(OBSERVATION_FIELDS),), np.float32, 'observation')
    self._action_spec = array_spec.BoundedArraySpec(
        (1,), np.float32, -1.0, 1.0, 'hvac_power')

  # -- physics -----------------------------------------------------------------

  def hour(self, step_index: int) -> float:
    """Returns the hour of day at the start of a step.

    Args:
      step_index: steps since midnight.

    Returns:
      Hours since midnight, 0 <= h < 24.
    """
    return (step_index * self._dt_h) % 24

  def occupied(self, hour: float) -> bool:
    """Tells whether the zone is occupied.

    Args:
      hour: hour of day.

    Returns:
      True within `occupied_hours`.
    """
    start, end = self._occupied_hours
    return start <= hour < end

  def comfort_band(self, hour: float) -> Tuple[float, float]:
    """Returns the comfort band in force.

    Args:
      hour: hour of day.

    Returns:
      (low, high) °C: the comfort band when occupied, else the setback band.
    """
    return self._comfort_band if self.occupied(hour) else self._setback_band

  def outdoor_temperature(self, hour: float) -> float:
    """Returns the outdoor temperature of the daily cycle (without noise).

    Args:
      hour: hour of day.

    Returns:
      °C; coldest at 03:00, warmest at 15:00.
    """
    mean, amplitude, _ = self._outdoor
    return mean + amplitude * math.sin(2 * math.pi * (hour - 9) / 24)

  def next_indoor_temperature(self, indoor: float, outdoor: float,
                              hvac_kw: float, occupied: bool) -> float:
    """Exact RC solution over one step with constant inputs.

    Args:
      indoor: indoor temperature now, °C.
      outdoor: outdoor temperature over the step, °C.
      hvac_kw: HVAC thermal power over the step, kW.
      occupied: whether internal gains apply.

    Returns:
      The indoor temperature after one step, °C.
    """
    gains = hvac_kw + (self._internal_gain if occupied else 0.0)
    equilibrium = outdoor + self._r * gains
    return equilibrium + (indoor - equilibrium) * self._decay

  # -- PyEnvironment -----------------------------------------------------------

  def observation_spec(self):
    """The observation spec.

    Returns:
      float32[5]: indoor °C, outdoor °C, hour sin, hour cos, occupied.
    """
    return self._observation_spec

  def action_spec(self):
    """The action spec.

    Returns:
      float32[1] in [-1, 1]: HVAC power, positive heats.
    """
    return self._action_spec

  def _observe(self) -> np.ndarray:
    hour = self.hour(self._step_index)
    angle = 2 * math.pi * hour / 24
    return np.array([self._indoor, self._outdoor_now, math.sin(angle),
                     math.cos(angle), float(self.occupied(hour))], np.float32)

  def _sample_outdoor(self) -> float:
    noise = self._outdoor[2]
    return self.outdoor_temperature(self.hour(self._step_index)) + (
        self._rng.normal(0.0, noise) if noise else 0.0)

  def _reset(self):
    self._step_index = 0
    self._indoor = float(self._rng.uniform(*self._initial_temperature))
    self._outdoor_now = self._sample_outdoor()
    self._episode_ended = False
    return ts.restart(self._observe())

  def _step(self, action):
    if self._episode_ended:
      return self.reset()
    u = float(np.clip(np.asarray(action, np.float32).reshape(-1)[0], -1, 1))
    hour = self.hour(self._step_index)
    hvac_kw = u * self._max_power
    occupied = self.occupied(hour)
    self._indoor = self.next_indoor_temperature(self._indoor, self._outdoor_now,
                                                hvac_kw, occupied)
    low, high = self.comfort_band(hour)
    violation = max(low - self._indoor, 0.0) + max(self._indoor - high, 0.0)
    price = self._prices[0] if 8 <= hour < 20 else self._prices[1]
    energy_cost = price * abs(hvac_kw) / self._cop * self._dt_h
    reward = np.float32(-(energy_cost +
                          self._comfort_weight * violation * self._dt_h))
    self._step_index += 1
    self._outdoor_now = self._sample_outdoor()
    if self._step_index >= self.steps_per_episode:
      # The day ends by a time limit, not a terminal state: keep discount 1.
      self._episode_ended = True
      return ts.truncation(self._observe(), reward)
    return ts.transition(self._observe(), reward, discount=np.float32(1.0))
