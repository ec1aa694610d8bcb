"""Real Atari frames for the benchmark, as a TF-Agents driver writes them.

`ALE/<game>-v5` (Pong by default, or any ALE game) with no frame skip of its
own and sticky actions (`repeat_action_probability` 0.25), Gymnasium's
`AtariPreprocessing` (`frame_skip` 4, 84x84 grayscale) and
`FrameStackObservation(4)`: an observation is `uint8[4, 84, 84]`, oldest
frame first (`stack_axis=-1` hands the sides TF-Agents' own Atari layout
instead, `uint8[84, 84, 4]` as its `FrameStack4` makes it: the same frames on
the last axis, each stack contiguous). A seeded random policy plays it; the stream is what a TF-Agents
driver hands its observers: FIRST and MID steps, the last transition
(`next_step_type` LAST), then the boundary step (`step_type` LAST,
`next_step_type` FIRST of the next episode).

Generating is slow next to writing (ALE runs 4 frames a step), so the stream
is made once, before anything is measured, and cached as one `.npy` per
field in `<output_dir>/atari_frames/<game>_seed<seed>/`; a rerun with as many
steps or fewer reads the cache (a prefix of a longer stream is the stream of
fewer steps: the generator is sequential and seeded).
"""

import json
import os
import shutil
from typing import Dict, List

import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory as trajectory_lib
import tree

from smart_replay.utils import progress_log

GAME = 'Pong'  # The default game.
STACK = 4
SCREEN = 84
NUM_ACTIONS = 18  # ALE's full action set bounds every game's actions.
FIELDS = ('step_type', 'observation', 'action', 'next_step_type', 'reward',
          'discount')
STACK_AXES = (0, -1)


def check_stack_axis(stack_axis: int) -> None:
  """Raises ValueError naming `stack_axis` unless it is 0 or -1."""
  if isinstance(stack_axis, bool) or stack_axis not in STACK_AXES:
    raise ValueError(f'stack_axis must be 0 (uint8[4, 84, 84], Gymnasium) or '
                     f'-1 (uint8[84, 84, 4], TF-Agents), got {stack_axis!r}.')


def observation_shape(stack_axis: int = 0) -> List[int]:
  """`[4, 84, 84]` (stack_axis 0) or `[84, 84, 4]` (-1)."""
  check_stack_axis(stack_axis)
  return [STACK, SCREEN, SCREEN] if stack_axis == 0 else [
      SCREEN, SCREEN, STACK]


def data_spec(stack_axis: int = 0) -> trajectory_lib.Trajectory:
  """The spec of one step: observation `uint8[4, 84, 84]`, action int64.

  Args:
    stack_axis: 0, or -1 for observations `uint8[84, 84, 4]`.

  Returns:
    The `Trajectory` of (bounded) `tf.TensorSpec`s.
  """
  return trajectory_lib.Trajectory(
      step_type=tf.TensorSpec([], tf.int32, 'step_type'),
      observation=tensor_spec.BoundedTensorSpec(
          observation_shape(stack_axis), tf.uint8, 0, 255, 'observation'),
      action=tensor_spec.BoundedTensorSpec([], tf.int64, 0, NUM_ACTIONS - 1,
                                           'action'),
      policy_info=(),
      next_step_type=tf.TensorSpec([], tf.int32, 'step_type'),
      reward=tf.TensorSpec([], tf.float32, 'reward'),
      discount=tensor_spec.BoundedTensorSpec([], tf.float32, 0.0, 1.0,
                                             'discount'))


def raw_bytes_per_step() -> int:
  """Bytes of one step's tensors, without any framing (28,248)."""
  return sum(s.dtype.size * s.shape.num_elements()
             for s in tree.flatten(data_spec()))


def check_game(game: str) -> None:
  """Checks that ALE knows `game`, without starting it.

  Args:
    game: an ALE game name, e.g. 'Pong'.

  Raises:
    ValueError: if it is not one (Gymnasium's message suggests a name).
  """
  import ale_py  # pylint: disable=g-import-not-at-top
  import gymnasium  # pylint: disable=g-import-not-at-top
  gymnasium.register_envs(ale_py)
  try:
    gymnasium.spec(f'ALE/{game}-v5')
  except gymnasium.error.Error as e:
    raise ValueError(f'game={game!r} is not an ALE game: {e}') from None


def _make_env(game: str):
  """`game` with the DQN preprocessing and a stack of 4 frames, oldest
  first."""
  import ale_py  # pylint: disable=g-import-not-at-top
  import gymnasium  # pylint: disable=g-import-not-at-top
  gymnasium.register_envs(ale_py)
  env = gymnasium.make(f'ALE/{game}-v5', frameskip=1,
                       repeat_action_probability=0.25)
  env = gymnasium.wrappers.AtariPreprocessing(
      env, frame_skip=4, screen_size=SCREEN, grayscale_obs=True)
  return gymnasium.wrappers.FrameStackObservation(env, STACK)


def generate(steps: int, seed: int = 0, game: str = GAME
             ) -> Dict[str, np.ndarray]:
  """Plays `steps` steps of `game` with a seeded random policy.

  Args:
    steps: steps of the stream (boundary steps included).
    seed: seeds the first reset (ALE, sticky actions, no-ops) and the policy.
    game: the ALE game, e.g. 'Pong' or 'Breakout'.

  Returns:
    `{field: array}` for every `FIELDS` entry, `steps` long; observation
    `uint8[steps, 4, 84, 84]`.
  """
  env = _make_env(game)
  actions = int(env.action_space.n)
  rng = np.random.default_rng(seed)
  arrays = {
      'step_type': np.zeros(steps, np.int32),
      'observation': np.zeros((steps, STACK, SCREEN, SCREEN), np.uint8),
      'action': np.zeros(steps, np.int64),
      'next_step_type': np.zeros(steps, np.int32),
      'reward': np.zeros(steps, np.float32),
      'discount': np.ones(steps, np.float32)}
  observation, _ = env.reset(seed=seed)
  current = 0
  with progress_log.ProgressLog('atari frames (not timed)', steps,
                                'steps') as progress:
    for index in range(steps):
      action = int(rng.integers(actions))
      arrays['step_type'][index] = current
      arrays['observation'][index] = observation
      arrays['action'][index] = action
      if current == 2:  # The boundary step, then a new episode.
        observation, _ = env.reset()
        current = 0
      else:
        observation, reward, terminated, truncated, _ = env.step(action)
        current = 2 if terminated or truncated else 1
        arrays['reward'][index] = reward
        arrays['discount'][index] = 0.0 if terminated else 1.0
      arrays['next_step_type'][index] = current
      progress.update(index + 1)
  env.close()
  return arrays


def cached_frames(output_dir: str, steps: int, seed: int = 0,
                  game: str = GAME) -> Dict[str, np.ndarray]:
  """The first `steps` steps of the seeded stream, from the cache or made.

  Args:
    output_dir: the benchmark's output folder (the cache is in its
      `atari_frames/` folder).
    steps: steps wanted.
    seed: the stream's seed.
    game: the ALE game.

  Returns:
    `{field: array}`, `steps` long, loaded into memory.
  """
  folder = cache_folder(output_dir, seed, game)
  cached = 0
  try:
    with open(os.path.join(folder, 'meta.json')) as f:
      cached = json.load(f)['steps']
  except (OSError, ValueError, KeyError):
    pass
  if cached >= steps:
    return load(folder, steps)
  arrays = generate(steps, seed, game)
  partial = folder + '.partial'
  shutil.rmtree(partial, ignore_errors=True)
  os.makedirs(partial)
  for name, array in arrays.items():
    np.save(os.path.join(partial, f'{name}.npy'), array)
  with open(os.path.join(partial, 'meta.json'), 'w') as f:
    json.dump({'steps': steps, 'seed': seed, 'game': game}, f)
  shutil.rmtree(folder, ignore_errors=True)
  os.replace(partial, folder)  # A cache is complete or absent.
  return arrays


def cache_folder(output_dir: str, seed: int = 0, game: str = GAME) -> str:
  """Where the stream of `game` and `seed` is cached under `output_dir`."""
  return os.path.join(output_dir, 'atari_frames',
                      f'{game.lower()}_seed{seed}')


def load(folder: str, steps: int) -> Dict[str, np.ndarray]:
  """The first `steps` steps of a cached stream, copied into memory.

  Args:
    folder: a `cache_folder`.
    steps: steps to read (at most the cached count).

  Returns:
    `{field: array}`, each its own in-memory array (not a file mapping, so
    that reading it later does not grow the resident memory).
  """
  return {name: np.array(np.load(os.path.join(folder, f'{name}.npy'),
                                 mmap_mode='r')[:steps])
          for name in FIELDS}


def trajectories(arrays: Dict[str, np.ndarray], stack_axis: int = 0
                 ) -> List[trajectory_lib.Trajectory]:
  """The stream as numpy `Trajectory`s (views of `arrays`).

  Args:
    arrays: `{field: array}` as `generate` returns; with `stack_axis=-1`
      its observations are replaced by a contiguous copy with the frames
      on the last axis (what TF-Agents' `FrameStack4` hands a driver).
    stack_axis: 0 or -1 (see `data_spec`).

  Returns:
    One `Trajectory` per step.
  """
  check_stack_axis(stack_axis)
  if stack_axis == -1:
    arrays['observation'] = np.ascontiguousarray(
        np.moveaxis(arrays['observation'], 1, -1))
  count = len(arrays['step_type'])
  return [trajectory_lib.Trajectory(
      policy_info=(), **{name: arrays[name][index] for name in FIELDS})
          for index in range(count)]


def episodes(arrays: Dict[str, np.ndarray]) -> int:
  """Episodes that ended in the stream (boundary steps)."""
  return int(np.sum(arrays['step_type'] == 2))
