"""Atari games as TF-Agents environments: 'atari:<Game>', e.g. 'atari:Pong'.

The Arcade Learning Environment (`ale-py`, whose wheels ship the ROMs) behind
the standard DQN preprocessing: `ALE/<Game>-v5` with sticky actions
(`repeat_action_probability` 0.25) and no frame skip of its own, then
Gymnasium's `AtariPreprocessing` (up to 30 no-op actions after a reset, the
max of the last two of every 4 frames, grayscale, 84x84) and
`FrameStackObservation` of the last 4 frames, oldest first: an observation is
`uint8[4, 84, 84]`, and mid-episode `obs[t][:3] == obs[t - 1][1:]`
(`stack_axis=-1`: `uint8[84, 84, 4]`, the layout of TF-Agents' `suite_atari`
and its DQN networks, and `obs[t][..., :3] == obs[t - 1][..., 1:]`). Episodes
end at game over (terminated, discount 0) or at ALE's frame limit
(truncated, discount 1), as `gymnasium_env.GymnasiumEnv` maps them.

Needs the `atari` extra: `pip install -e '.[atari]'` (`make install` does).
"""

import difflib
from typing import Any, List, Optional

import numpy as np

from smart_replay import errors
from smart_replay.apps.envs import gymnasium_env

FRAME_SKIP = 4
SCREEN_SIZE = 84
FRAME_STACK = 4
STICKY_ACTION_PROBABILITY = 0.25
_ALE_VERSION = 'v5'
_INSTALL_HINT = ("Atari environments ('atari:<Game>') need the atari extra "
                 "(ale-py with its ROMs, opencv-python-headless): pip install "
                 "-e '.[atari]' in the repository, or make install.")
# Shown when a game name is unknown, with the closest matches.
_EXAMPLES = ('Pong', 'Breakout', 'SpaceInvaders', 'Seaquest', 'Qbert',
             'MsPacman')


def _gymnasium_with_ale() -> Any:
  """Gymnasium with the ALE environments registered.

  Returns:
    The `gymnasium` module.

  Raises:
    MissingExtraError: if ale-py or OpenCV (the atari extra) is missing.
  """
  import gymnasium  # pylint: disable=g-import-not-at-top
  try:
    import ale_py  # pylint: disable=g-import-not-at-top
    import cv2  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise errors.MissingExtraError(f'{_INSTALL_HINT} ({e})') from e
  gymnasium.register_envs(ale_py)
  return gymnasium


def game_names() -> List[str]:
  """The games 'atari:<Game>' accepts: every registered `ALE/<Game>-v5`.

  Returns:
    The game names, sorted (e.g. 'Breakout', 'Pong').

  Raises:
    MissingExtraError: if the atari extra is not installed.
  """
  gymnasium = _gymnasium_with_ale()
  suffix = f'-{_ALE_VERSION}'
  return sorted(env_id[len('ALE/'):-len(suffix)]
                for env_id in gymnasium.registry
                if env_id.startswith('ALE/') and env_id.endswith(suffix))


def _unknown_game(game: str, games: List[str]) -> ValueError:
  """The error for a game ALE does not have: close names, then examples."""
  by_lower = {name.lower(): name for name in games}
  lower = str(game).lower()
  close = [by_lower[lower]] if lower in by_lower else [
      by_lower[name] for name in difflib.get_close_matches(
          lower, list(by_lower), n=3, cutoff=0.6)]
  hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close \
      else ''
  return ValueError(
      f'unknown Atari game {game!r} in env {"atari:" + str(game)!r}.{hint} '
      f'Valid games are the <Game> of the ALE/<Game>-v5 ids (case-sensitive), '
      f'e.g. {", ".join(_EXAMPLES)}; {len(games)} in all.')


def _stack_last(env: Any, gymnasium: Any) -> Any:
  """`env` (observations `[D, H, W]`) with observations `[H, W, D]`."""
  space = env.observation_space
  return gymnasium.wrappers.TransformObservation(
      env, lambda obs: np.ascontiguousarray(np.moveaxis(obs, 0, -1)),
      gymnasium.spaces.Box(low=np.moveaxis(space.low, 0, -1),
                           high=np.moveaxis(space.high, 0, -1),
                           dtype=space.dtype))


def make_atari_env(game: str, *, seed: Optional[int] = 0,
                   stack_axis: int = 0) -> gymnasium_env.GymnasiumEnv:
  """Makes an Atari game with DQN preprocessing as a TF-Agents environment.

  Args:
    game: an ALE game name as in `ALE/<Game>-v5`, e.g. 'Pong' or 'Breakout'
      (case-sensitive).
    seed: seeds the first reset (ALE, sticky actions and the no-ops); None
      leaves it to Gymnasium.
    stack_axis: where the 4 frames are stacked: 0 (Gymnasium's
      `FrameStackObservation`, `[4, 84, 84]`) or -1 (TF-Agents'
      `suite_atari` and its DQN networks, `[84, 84, 4]`).

  Returns:
    A `GymnasiumEnv` with observations `uint8[4, 84, 84]` (the last 4
    grayscale frames, oldest first; `uint8[84, 84, 4]` with `stack_axis=-1`)
    and the game's discrete actions.

  Raises:
    MissingExtraError: if the atari extra (ale-py, opencv) is not installed.
    ValueError: if ALE has no game `game` (the message names it, the closest
      names and a few valid ones), or `stack_axis` is neither 0 nor -1.
  """
  if stack_axis not in (0, -1):
    raise ValueError(f'stack_axis={stack_axis!r}: the frames are stacked on '
                     'the first axis (0: [4, 84, 84]) or the last (-1: '
                     '[84, 84, 4]).')
  gymnasium = _gymnasium_with_ale()
  games = game_names()
  if game not in games:
    raise _unknown_game(game, games)
  env = gymnasium.make(f'ALE/{game}-{_ALE_VERSION}', frameskip=1,
                       repeat_action_probability=STICKY_ACTION_PROBABILITY)
  env = gymnasium.wrappers.AtariPreprocessing(
      env, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE, grayscale_obs=True)
  env = gymnasium.wrappers.FrameStackObservation(env, FRAME_STACK)
  if stack_axis == -1:
    env = _stack_last(env, gymnasium)
  return gymnasium_env.GymnasiumEnv(env, seed=seed)
