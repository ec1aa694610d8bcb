"""The `make demo` job: collect with a real driver, checkpoint, reload, sample.

Until the populate command lands this is the main job on the embedded default:
CartPole-v1 (shipped with gym, no download) and a random policy.
"""

import os
from typing import Any, Dict

from absl import logging
import gin
import numpy as np
import tqdm
from tf_agents.drivers import py_driver
from tf_agents.environments import suite_gym
from tf_agents.policies import random_py_policy
from tf_agents.specs import tensor_spec

from smart_replay import manager as manager_lib


@gin.configurable
def run_demo(*, output_dir: str, steps: int = 2000, capacity: int = 10_000,
             sequence_length: int = 2, batch_size: int = 32,
             chunk: int = 250, show_progress: bool = True) -> Dict[str, Any]:
  """Fills a buffer from CartPole with a random policy, reloads and samples it.

  Args:
    output_dir: where the buffer directory `cartpole_random` is written
      (replaced if it exists).
    steps: environment steps to collect (>= 1).
    capacity: buffer capacity in items.
    sequence_length: steps per item.
    batch_size: size of the batch sampled after reloading.
    chunk: steps per driver run between progress updates.
    show_progress: draw a tqdm progress bar.

  Returns:
    A summary dict: `buffer_dir`, `checkpoint`, `items`, `env_steps`,
    `episodes`, `batch_shape`, `batch_mean_reward`.

  Raises:
    ValueError: if `steps` or `chunk` is not a positive integer.
  """
  if not isinstance(steps, int) or steps < 1:
    raise ValueError(f'steps must be a positive integer, got {steps!r}.')
  if not isinstance(chunk, int) or chunk < 1:
    raise ValueError(f'chunk must be a positive integer, got {chunk!r}.')
  env = suite_gym.load('CartPole-v1')
  policy = random_py_policy.RandomPyPolicy(env.time_step_spec(),
                                           env.action_spec())
  data_spec = tensor_spec.from_spec(policy.collect_data_spec)
  buffer_dir = os.path.join(output_dir, 'cartpole_random')

  def new_manager():
    return manager_lib.ReplayBufferManager(
        data_spec, capacity=capacity, checkpoint_dir=buffer_dir,
        sequence_length=sequence_length, sample_timeout_s=30.0)

  with new_manager() as manager:
    _, observer = manager.create_replay_buffer(overwrite=True)
    # Each chunk continues from the previous time step, so chunking never
    # cuts an episode (a new Actor would reset the environment).
    time_step, policy_state = env.reset(), policy.get_initial_state()
    done = 0
    with tqdm.tqdm(total=steps, unit='step', disable=not show_progress,
                   desc='collecting') as bar:
      while done < steps:
        n = min(chunk, steps - done)
        time_step, policy_state = py_driver.PyDriver(
            env, policy, observers=[observer], max_steps=n).run(
                time_step, policy_state)
        done += n
        bar.update(n)
        bar.set_postfix(items=manager.num_frames())
    checkpoint = manager.checkpoint()
    logging.info('Wrote %s', checkpoint)

  with new_manager() as manager:  # A fresh manager, as a new process would.
    manager.load_replay_buffer()
    trajectory, _ = next(iter(manager.get_dataset(batch_size=batch_size)))
    stats = manager.stats()
    return {
        'buffer_dir': buffer_dir,
        'checkpoint': checkpoint,
        'items': manager.num_frames(),
        'env_steps': stats['env_steps'],
        'episodes': stats['episodes'],
        'batch_shape': tuple(trajectory.observation.shape),
        'batch_mean_reward': float(np.mean(trajectory.reward.numpy())),
    }
