"""Greedy evaluation of an agent during and after training.

`Evaluation` runs the agent's greedy policy for a few episodes in its own
environment with a TF-Agents `Actor` and `actor.eval_metrics`, as TF-Agents'
train-eval examples do, and writes the results at the current train step in
two places:

- `<run_dir>/eval/`: TF-Agents' standard `Metrics/AverageReturn` and
  `Metrics/AverageEpisodeLength` (TensorBoard draws them on the same charts
  as the collect policy's, as runs `train` and `eval`);
- the train summary writer (`<run_dir>/train/`, beside the buffer scalars):
  `eval/AverageReturn` and `eval/AverageEpisodeLength`, so that one event
  file holds everything about the run.
"""

from typing import Any, Optional

from absl import logging
import numpy as np
import tensorflow as tf
from tf_agents.policies import py_tf_eager_policy
from tf_agents.train import actor

from smart_replay.apps.envs import factory as env_factory

# The tags written into the train summary writer.
RETURN_TAG = 'eval/AverageReturn'
LENGTH_TAG = 'eval/AverageEpisodeLength'


def greedy_return(policy: Any, env: Any, episodes: int) -> float:
  """Mean undiscounted return of `policy` over `episodes` episodes.

  Args:
    policy: a py policy (e.g. `PyTFEagerPolicy(agent.policy)`).
    env: a py environment.
    episodes: how many episodes.

  Returns:
    The mean return.
  """
  returns = []
  for _ in range(episodes):
    time_step, total = env.reset(), 0.0
    state = policy.get_initial_state()
    while not time_step.is_last():
      step = policy.action(time_step, state)
      state = step.state
      time_step = env.step(step.action)
      total += float(time_step.reward)
    returns.append(total)
  return float(np.mean(returns))


class Evaluation:
  """Runs the greedy policy for some episodes; writes TF-Agents' metrics.

  Each call resets the evaluation environment (made with `seed + 1`), runs
  `episodes` episodes and writes the average return and episode length at
  the current train step (see the module docstring).

  Args:
    env_name: the environment (as `envs.factory.make_environment` takes it).
    seed: the run's seed; the evaluation environment uses `seed + 1`.
    tf_agent: the agent; its greedy `policy` is evaluated.
    train_step: the train step variable (the summaries' step).
    episodes: episodes per evaluation; 0 makes every call a no-op.
    summary_dir: TF-Agents' eval directory (`<run_dir>/eval`).
    train_writer: the train summary writer for `eval/*`, or None.

  Raises:
    ValueError: if `episodes` is not a non-negative integer.
  """

  def __init__(self, env_name: str, seed: int, tf_agent: Any,
               train_step: tf.Variable, *, episodes: int, summary_dir: str,
               train_writer: Optional[tf.summary.SummaryWriter] = None):
    if isinstance(episodes, bool) or not isinstance(episodes, int) or (
        episodes < 0):
      raise ValueError('episodes must be a non-negative integer, got '
                       f'{episodes!r}.')
    self._episodes = episodes
    self._train_step = train_step
    self._train_writer = train_writer
    self._metrics = actor.eval_metrics(buffer_size=max(episodes, 1))
    self._actor = actor.Actor(
        env_factory.make_environment(env_name, seed=seed + 1),
        py_tf_eager_policy.PyTFEagerPolicy(tf_agent.policy,
                                           use_tf_function=True),
        train_step, episodes_per_run=episodes,
        metrics=self._metrics, summary_dir=summary_dir,
        summary_interval=0  # Written by __call__, once per evaluation.
    ) if episodes else None

  def __call__(self) -> Optional[float]:
    """Evaluates now.

    Returns:
      The average return of the greedy policy, or None if `episodes` is 0.
    """
    if self._actor is None:
      return None
    for metric in self._metrics:
      metric.reset()
    self._actor.reset()
    self._actor.run()
    self._actor.write_metric_summaries()
    self._actor.summary_writer.flush()
    average_return, average_length = (float(m.result())
                                      for m in self._metrics)
    step = int(self._train_step.numpy())
    if self._train_writer is not None:
      with self._train_writer.as_default(), tf.summary.record_if(True):
        tf.summary.scalar(RETURN_TAG, average_return, step=step)
        tf.summary.scalar(LENGTH_TAG, average_length, step=step)
      self._train_writer.flush()
    logging.info('Greedy return over %d episodes at train step %d: %.2f '
                 '(episode length %.1f)', self._episodes, step, average_return,
                 average_length)
    return average_return
