"""A Gymnasium environment as a TF-Agents `PyEnvironment`.

TF-Agents 0.19 has no Gymnasium suite. This adapter maps Gymnasium's
five-tuple `step` to TF-Agents time steps: `terminated` becomes a terminal
step (`discount` 0: no value beyond it), `truncated` a time-limit step
(`step_type` LAST, `discount` 1: the value beyond it still counts), anything
else a mid step. `Box` and `Discrete` spaces become bounded array specs; an
observation `Box` with the same bounds everywhere (pixels: 0..255) gets scalar
bounds, so manifests and provenance do not list them per pixel.
"""

from typing import Any, Optional, Union

import numpy as np
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from smart_replay import errors


def _spec(space: Any, name: str) -> array_spec.BoundedArraySpec:
  """The TF-Agents spec of a Gymnasium `Box` or `Discrete` space."""
  import gymnasium  # pylint: disable=g-import-not-at-top
  if isinstance(space, gymnasium.spaces.Discrete):
    return array_spec.BoundedArraySpec(
        (), np.int64, minimum=int(space.start),
        maximum=int(space.start + space.n - 1), name=name)
  if isinstance(space, gymnasium.spaces.Box):
    low, high = space.low, space.high
    if (name == 'observation' and low.size and np.all(low == low.flat[0])
        and np.all(high == high.flat[0])):
      low, high = low.flat[0], high.flat[0]
    return array_spec.BoundedArraySpec(
        space.shape, space.dtype, minimum=low, maximum=high, name=name)
  raise ValueError(f'the {name} space {space!r} is not supported; expected a '
                   'gymnasium Box or Discrete space.')


class GymnasiumEnv(py_environment.PyEnvironment):
  """A Gymnasium environment behind the TF-Agents `PyEnvironment` API.

  Args:
    env_id: a registered Gymnasium id, e.g. 'CartPole-v1', or an environment
      already made (and wrapped), e.g. by `atari_env.make_atari_env`.
    seed: seeds the first reset (and so the episodes that follow); None
      leaves it to Gymnasium.
    discount: the discount of non-terminal steps.
    **kwargs: passed to `gymnasium.make`.

  Raises:
    MissingExtraError: if gymnasium is not installed.
    ValueError: if `env_id` is not registered, a space is neither `Box`
      nor `Discrete`, or `kwargs` come with an environment already made.
  """

  def __init__(self, env_id: Union[str, Any], *, seed: Optional[int] = None,
               discount: float = 1.0, **kwargs):
    super().__init__(handle_auto_reset=True)
    try:
      import gymnasium  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise errors.MissingExtraError(
          "gymnasium is needed for 'gymnasium:<id>' environments: pip "
          "install 'gymnasium==1.3.0' (make install does).") from e
    if not isinstance(env_id, str):
      if kwargs:
        raise ValueError(f'gymnasium.make arguments {sorted(kwargs)} need an '
                         f'environment id, not the made {env_id!r}.')
      self._env = env_id
    else:
      try:
        self._env = gymnasium.make(env_id, **kwargs)
      except gymnasium.error.Error as e:
        raise ValueError(f'unknown Gymnasium environment id {env_id!r} '
                         f'({e}).') from None
    self._seed = seed
    self._discount = np.float32(discount)
    self._observation_spec = _spec(self._env.observation_space, 'observation')
    self._action_spec = _spec(self._env.action_space, 'action')

  @property
  def gym(self) -> Any:
    """The wrapped Gymnasium environment (named like suite_gym's wrapper,
    so policies find its `spec.id`)."""
    return self._env

  def observation_spec(self) -> array_spec.BoundedArraySpec:
    """The observation space as a bounded array spec."""
    return self._observation_spec

  def action_spec(self) -> array_spec.BoundedArraySpec:
    """The action space as a bounded array spec."""
    return self._action_spec

  def _observation(self, value: Any) -> np.ndarray:
    return np.asarray(value, dtype=self._observation_spec.dtype)

  def _reset(self) -> ts.TimeStep:
    observation, _ = self._env.reset(seed=self._seed)
    self._seed = None  # Later episodes follow from the seeded generator.
    return ts.restart(self._observation(observation))

  def _step(self, action: Any) -> ts.TimeStep:
    action = np.asarray(action, dtype=self._action_spec.dtype)
    if self._action_spec.shape == ():
      action = action.item()
    observation, reward, terminated, truncated, _ = self._env.step(action)
    observation = self._observation(observation)
    reward = np.float32(reward)
    if terminated:
      return ts.termination(observation, reward)
    if truncated:
      return ts.truncation(observation, reward, self._discount)
    return ts.transition(observation, reward, self._discount)

  def close(self) -> None:
    """Closes the Gymnasium environment."""
    self._env.close()
