"""The schedule (thermostat) baseline policy for `ThermalZoneEnv`.

Comfort setpoint during occupied hours (starting `preheat_hours` early so the
zone is comfortable when people arrive), setback band at night, and a
proportional thermostat with a dead band to reach them, saturated to the
action range.
"""

from typing import Tuple

import gin
import numpy as np
from tf_agents.policies import py_policy
from tf_agents.trajectories import policy_step

from smart_replay.apps.envs import thermal


@gin.configurable
class SchedulePolicy(py_policy.PyPolicy):
  """Setpoint schedule + proportional thermostat (unbatched time steps).

  Args:
    time_step_spec: the environment's time step spec.
    action_spec: the environment's action spec (float32[1] in [-1, 1]).
    occupied_hours: (start, end) of the comfort schedule, hours.
    occupied_setpoint: target °C during the comfort schedule.
    setback_band: (low, high) °C kept outside the comfort schedule.
    preheat_hours: how long before `start` the comfort setpoint applies.
    gain: action per °C of error (> 0).
    deadband: °C of error around the target where the HVAC stays off.

  Raises:
    ValueError: if `gain` <= 0 or `deadband` < 0.
  """

  def __init__(self, time_step_spec, action_spec, *,
               occupied_hours: Tuple[float, float] = (8.0, 18.0),
               occupied_setpoint: float = 22.5,
               setback_band: Tuple[float, float] = (16.0, 28.0),
               preheat_hours: float = 2.0, gain: float = 2.0,
               deadband: float = 0.25):
    if gain <= 0:
      raise ValueError(f'SchedulePolicy gain must be > 0, got {gain!r}.')
    if deadband < 0:
      raise ValueError(f'SchedulePolicy deadband must be >= 0, got '
                       f'{deadband!r}.')
    super().__init__(time_step_spec, action_spec)
    self._occupied_hours = occupied_hours
    self._setpoint = float(occupied_setpoint)
    self._setback_band = setback_band
    self._preheat = float(preheat_hours)
    self._gain = float(gain)
    self._deadband = float(deadband)

  def target(self, hour: float, indoor: float) -> float:
    """Returns the temperature the thermostat steers to.

    Args:
      hour: hour of day.
      indoor: indoor temperature, °C.

    Returns:
      The setpoint, or `indoor` itself when inside the setback band (off).
    """
    start, end = self._occupied_hours
    if start - self._preheat <= hour < end:
      return self._setpoint
    low, high = self._setback_band
    return min(max(indoor, low + self._deadband), high - self._deadband)

  def _action(self, time_step, policy_state):
    observation = np.asarray(time_step.observation)
    indoor = float(observation[0])
    error = self.target(thermal.hour_from_observation(observation),
                        indoor) - indoor
    u = 0.0 if abs(error) <= self._deadband else float(
        np.clip(self._gain * error, -1.0, 1.0))
    return policy_step.PolicyStep(np.array([u], np.float32), policy_state, ())
