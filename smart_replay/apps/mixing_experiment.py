"""Does mixing a starter buffer into training help? Runs the comparison.

For one environment (`SETUPS`: CartPole with DQN from the scripted policy's
starter, or the thermal building with SAC from the schedule policy's), it
populates the starter once, then trains every variant (`VARIANTS`) with every
seed through `train_from_starter`, evaluating the greedy policy every
`eval_interval` train steps:

- 'no starter': the run's own experience only (`starter_mode='none'`);
- 'starter copied': the starter copied into the run's table, then evicted
  FIFO (`starter_mode='copy'`, what training did before mixing existed);
- 'fixed 50/50 mix': half of each batch from the read-only starter;
- 'annealed mix': 0.5 falling linearly to 0.1 over the run.

Each finished run leaves `result.json`, so an interrupted experiment resumes
where it stopped (a run cut short continues from its last paired
checkpoint). The learning curves and the table are drawn by
`experiment_report`.
"""

import dataclasses
import json
import os
from typing import Callable, Dict, List, Optional, Sequence

from absl import logging
import gin

from smart_replay.apps import configs
from smart_replay.apps import evaluation
from smart_replay.apps import experiment_report
from smart_replay.apps import populate
from smart_replay.apps import training
from smart_replay.apps.envs import factory as env_factory
from smart_replay.apps.policies import factory as policy_factory
from smart_replay.tools import provenance


@dataclasses.dataclass(frozen=True)
class Setup:
  """One environment's experiment settings.

  Attributes:
    env: the environment name (`envs.factory.make_environment`).
    policy: the baseline policy the starter is collected with.
    steps_per_run: populate's steps per run.
    num_runs: populate's runs (the starter holds their product in steps).
    gin_file: the shipped training config (agent and loop settings).
    num_train_steps: train steps per run.
    eval_interval: train steps between greedy evaluations.
    eval_episodes: episodes per evaluation.
  """
  env: str
  policy: str
  steps_per_run: int
  num_runs: int
  gin_file: str
  num_train_steps: int
  eval_interval: int
  eval_episodes: int


SETUPS = {
    'cartpole': Setup(env='gymnasium:CartPole-v1', policy='scripted',
                      steps_per_run=500, num_runs=4,
                      gin_file='train_dqn_cartpole.gin', num_train_steps=5000,
                      eval_interval=500, eval_episodes=5),
    'thermal': Setup(env=env_factory.THERMAL, policy='schedule',
                     steps_per_run=288, num_runs=10,
                     gin_file='train_sac_thermal.gin', num_train_steps=5000,
                     eval_interval=500, eval_episodes=3),
}

# Variant name -> train_from_starter arguments (the annealed mix's steps are
# the run's length).
VARIANTS = {
    'no starter': {'starter_mode': 'none'},
    'starter copied': {'starter_mode': 'copy'},
    'fixed 50/50 mix': {'starter_mode': 'mix', 'starter_fraction': 0.5},
    'annealed mix 0.5->0.1': {'starter_mode': 'mix', 'starter_fraction': 0.5,
                              'starter_fraction_final': 0.1},
}


def slug(name: str) -> str:
  """A directory name for a variant, e.g. 'fixed_50_50_mix'."""
  return ''.join(c if c.isalnum() else '_' for c in name).strip('_').replace(
      '__', '_')


def baseline_return(setup: Setup, episodes: int, seed: int = 0) -> float:
  """The starter's policy's mean return over `episodes` episodes.

  Args:
    setup: the environment's settings.
    episodes: episodes to average.
    seed: the environment's seed.

  Returns:
    The mean undiscounted return.
  """
  env = env_factory.make_environment(setup.env, seed=seed)
  policy = policy_factory.make_policy(setup.policy, env=env, seed=seed)
  return evaluation.greedy_return(policy, env, episodes)


@gin.configurable(denylist=['stop_requested'])
def run_experiment(
    *, setup_name: str, output_dir: str, seeds: Sequence[int] = (0, 1, 2),
    variants: Optional[Sequence[str]] = None,
    num_train_steps: Optional[int] = None,
    stop_requested: Optional[Callable[[], bool]] = None
) -> experiment_report.Report:
  """Runs (or finishes) the comparison for one environment and reports it.

  Args:
    setup_name: a key of `SETUPS` ('cartpole' or 'thermal').
    output_dir: where the starter, the runs, the figure and the table go
      (`<output_dir>/<setup_name>/...`).
    seeds: the seeds of every variant.
    variants: names from `VARIANTS`; default all.
    num_train_steps: overrides the setup's train steps per run.
    stop_requested: polled between runs and training phases; True stops
      after the current run's final checkpoint (run again to continue).

  Returns:
    The `experiment_report.Report` (also written as `report.json`, the
    figure `<setup_name>.png` and the table `table.md`).

  Raises:
    ValueError: if `setup_name`, a variant or a seed is unknown or invalid.
  """
  if setup_name not in SETUPS:
    raise ValueError(f'setup_name must be one of {sorted(SETUPS)}, got '
                     f'{setup_name!r}.')
  variants = list(variants or VARIANTS)
  unknown = [v for v in variants if v not in VARIANTS]
  if unknown:
    raise ValueError(f'unknown variants {unknown}; expected some of '
                     f'{list(VARIANTS)}.')
  if not seeds or any(isinstance(s, bool) or not isinstance(s, int)
                      for s in seeds):
    raise ValueError(f'seeds must be a non-empty list of integers, got '
                     f'{seeds!r}.')
  setup = SETUPS[setup_name]
  if num_train_steps is not None:
    setup = dataclasses.replace(setup, num_train_steps=num_train_steps)
  root = os.path.join(os.path.abspath(output_dir), setup_name)
  gin.parse_config_file(configs.resolve(setup.gin_file))
  starter = _starter(setup, root)
  reference = baseline_return(setup, episodes=max(10, setup.eval_episodes))
  logging.info('%s: the %s policy returns %.2f per episode.', setup_name,
               setup.policy, reference)
  curves: Dict[str, List[Dict[int, float]]] = {}
  for variant in variants:
    for seed in seeds:
      if stop_requested is not None and stop_requested():
        break
      run_dir = os.path.join(root, slug(variant), f'seed{seed}')
      _train(setup, variant, seed, starter, run_dir, stop_requested)
      curves.setdefault(variant, []).append(
          experiment_report.read_eval_curve(run_dir))
  report = experiment_report.Report(
      setup=setup_name, env=setup.env, policy=setup.policy,
      baseline_return=reference, num_train_steps=setup.num_train_steps,
      eval_interval=setup.eval_interval, seeds=list(seeds), curves=curves)
  experiment_report.write(report, root)
  return report


def _starter(setup: Setup, root: str) -> str:
  """Populates the starter buffer once; returns its directory."""
  name = 'starter'
  buffer_dir = os.path.join(root, provenance.buffer_dir_name(
      name, 2, setup.steps_per_run * setup.num_runs))
  if not os.path.isdir(buffer_dir):
    result = populate.populate_starter_buffer(
        buffer_name=name, output_dir=root, env=setup.env,
        policy=setup.policy, steps_per_run=setup.steps_per_run,
        num_runs=setup.num_runs, show_progress=False)
    buffer_dir = result.buffer_dir
  return buffer_dir


def _train(setup: Setup, variant: str, seed: int, starter: str,
           run_dir: str, stop_requested) -> None:
  """Trains one variant and seed, unless its `result.json` is complete."""
  record = os.path.join(run_dir, 'result.json')
  if os.path.isfile(record):
    with open(record) as f:
      if json.load(f).get('train_step') == setup.num_train_steps:
        logging.info('%s seed %d: done already (%s).', variant, seed, record)
        return
  arguments = dict(VARIANTS[variant])
  if 'starter_fraction_final' in arguments:
    arguments['starter_fraction_steps'] = setup.num_train_steps
  resume = os.path.isdir(os.path.join(run_dir, training.AGENT_DIR))
  logging.info('%s seed %d: training %d steps%s.', variant, seed,
               setup.num_train_steps, ' (resuming)' if resume else '')
  result = training.train_from_starter(
      starter_dir=starter, run_dir=run_dir, seed=seed,
      num_train_steps=setup.num_train_steps,
      eval_interval=setup.eval_interval, eval_episodes=setup.eval_episodes,
      resume=resume, overwrite=not resume and os.path.isdir(run_dir),
      stop_requested=stop_requested, **arguments)
  if not result.interrupted:
    with open(record, 'w') as f:
      json.dump(dataclasses.asdict(result), f, indent=2)
