"""Building environments by name: 'thermal', 'gymnasium:<id>', 'atari:<Game>'
or 'gym:<id>'."""

import gin
from tf_agents.environments import py_environment

from smart_replay.apps.envs import atari_env
from smart_replay.apps.envs import gymnasium_env
from smart_replay.apps.envs import thermal

THERMAL = 'thermal'
GYM_PREFIX = 'gym:'
GYMNASIUM_PREFIX = 'gymnasium:'
ATARI_PREFIX = 'atari:'


@gin.configurable
def make_environment(name: str = THERMAL, *, seed: int = 0
                     ) -> py_environment.PyEnvironment:
  """Creates the environment a buffer is populated from.

  Args:
    name: 'thermal' for the embedded `ThermalZoneEnv`, 'gymnasium:<id>' for
      a Gymnasium environment (`gymnasium_env.GymnasiumEnv`: terminated
      steps get discount 0, truncated ones 1; e.g. 'gymnasium:CartPole-v1'),
      'atari:<Game>' for an ALE game with DQN preprocessing
      (`atari_env.make_atari_env`: uint8[4, 84, 84] stacked frames; e.g.
      'atari:Pong'; needs the atari extra), or 'gym:<id>' for a (legacy) Gym
      environment loaded with `tf_agents.environments.suite_gym`.
    seed: environment seed.

  Returns:
    A TF-Agents `PyEnvironment` (unbatched).

  Raises:
    ValueError: if `name` is none of these forms, or the Gym id or Atari
      game is unknown; the message names it and what is accepted.
    MissingExtraError: for 'atari:<Game>' without the atari extra (ale-py,
      opencv); the message says how to install it.
  """
  if name == THERMAL:
    return thermal.ThermalZoneEnv(seed=seed)
  if isinstance(name, str) and name.startswith(GYMNASIUM_PREFIX):
    return gymnasium_env.GymnasiumEnv(name[len(GYMNASIUM_PREFIX):], seed=seed)
  if isinstance(name, str) and name.startswith(ATARI_PREFIX):
    return atari_env.make_atari_env(name[len(ATARI_PREFIX):], seed=seed)
  if isinstance(name, str) and name.startswith(GYM_PREFIX):
    gym_id = name[len(GYM_PREFIX):]
    import gym  # pylint: disable=g-import-not-at-top
    from tf_agents.environments import suite_gym  # pylint: disable=g-import-not-at-top
    try:
      gym.spec(gym_id)
    except gym.error.Error as e:
      raise ValueError(f'unknown Gym environment id {gym_id!r} in env '
                       f'{name!r} ({e}).') from None
    env = suite_gym.load(gym_id)
    env.seed(seed)
    return env
  raise ValueError(f'unknown env {name!r}; expected {THERMAL!r}, '
                   f"'{GYMNASIUM_PREFIX}<id>' (e.g. 'gymnasium:CartPole-v1'), "
                   f"'{ATARI_PREFIX}<Game>' (e.g. 'atari:Pong') or "
                   f"'{GYM_PREFIX}<id>'.")
