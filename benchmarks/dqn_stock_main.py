"""TF-Agents' own Atari DQN example, run from its wheel with stock Reverb.

`tf_agents/examples/dqn/mnih15/dqn_train_eval_atari.py` (TF-Agents 0.19)
unchanged but for its environment: `suite_atari.load` needs the old gym
Atari, so it is replaced by the same game from Gymnasium + ale-py as
`examples/dqn_atari.py` loads it (sticky actions, AtariPreprocessing, 4
frames on the last axis, `uint8[84, 84, 4]`, the same time limit). Its
replay buffer is the example's own: `reverb.Table`, `reverb.Server`,
`ReverbReplayBuffer`, `ReverbAddTrajectoryObserver`. `dqn_atari` runs this
file against `examples/dqn_atari.py`; the flags are the example's (importing
this module defines none: the example is imported when it runs).
"""

from typing import List, Optional

from absl import app
from absl import flags
from tf_agents.environments import wrappers

from smart_replay.apps.envs import atari_env


def load_atari(environment_name, max_episode_steps=None,
               gym_env_wrappers=()):
  """`suite_atari.load` as `examples/dqn_atari.py` replaces it."""
  del gym_env_wrappers  # Gymnasium's preprocessing and stacking instead.
  game = environment_name.split('-')[0]  # 'Pong-v0' -> 'Pong'.
  env = atari_env.make_atari_env(game, seed=None, stack_axis=-1)
  return wrappers.TimeLimit(env, duration=max_episode_steps)


def main(argv: Optional[List[str]] = None) -> None:
  """Runs TF-Agents' example with `load_atari` as its environment loader.

  Args:
    argv: the command line; None: `sys.argv`.
  """
  # pylint: disable-next=g-import-not-at-top (it defines its absl flags)
  from tf_agents.examples.dqn.mnih15 import dqn_train_eval_atari as stock
  stock.suite_atari.load = load_atari
  flags.mark_flag_as_required('root_dir')
  app.run(stock.main, argv)


if __name__ == '__main__':
  main()
