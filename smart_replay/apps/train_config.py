"""What `train_from_starter` is asked to do, in four groups checked when made.

* `AgentSetup`: what to train: the agent, its environment and the seed;
* `StarterUse`: which starter buffer, and how its data is used ('copy',
  'mix' with a fraction schedule, or 'none');
* `TrainLoop`: the loop: train steps, the collect and train phases, the
  batch size, and the intervals of checkpoints and evaluations;
* `RunOutput`: where the run writes (`run_dir` and its layout), whether it
  continues or replaces an existing run, and how progress is shown.

Each group is a frozen dataclass that names the first bad field, its value
and what was expected when it is made, before a server starts or a directory
changes; gin binds their fields (`TrainLoop.num_train_steps = 3000`).
`TrainConfig` holds the four; `TrainConfig.from_fields` builds it from the
flat field names (`train_from_starter`'s keyword arguments), each field going
to its group, so a message names the same argument either way.
"""

import dataclasses
import numbers
import os
from typing import Any, Optional, Tuple, Union

import gin

from smart_replay.apps import agents
from smart_replay.sampling import fraction_schedule as schedule_lib
from smart_replay.utils import checks

MODES = ('copy', 'mix', 'none')  # How the starter's data is used.

# The run's layout under run_dir (see `training`'s module docstring).
BUFFER_DIR = 'buffer'
AGENT_DIR = 'agent'
SUMMARY_DIR = 'train'
EVAL_DIR = 'eval'


def _path(name: str, value: Any) -> None:
  if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
    raise ValueError(f'{name} must be a non-empty path, got {value!r}.')


def _non_negative_int(name: str, value: Any, zero: str) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise ValueError(f'{name} must be a non-negative integer (0: {zero}), '
                     f'got {value!r}.')


@gin.configurable
@dataclasses.dataclass(frozen=True)
class AgentSetup:
  """What to train.

  Attributes:
    agent: 'auto' (DQN for a discrete action, SAC otherwise), 'dqn' or 'sac'
      (see `agents.make_agent`; its networks are bound on `make_dqn_agent`
      and `make_sac_agent`).
    env: the environment name; None (or ''): the one in the starter's
      provenance.
    seed: the environment and TensorFlow seed (the evaluation environment
      uses `seed + 1`).

  Raises:
    ValueError: naming the first bad field and its value.
  """
  agent: str = 'auto'
  env: Optional[str] = None
  seed: int = 0

  def __post_init__(self):
    if self.agent not in agents.KINDS:
      raise ValueError(f'unknown agent {self.agent!r}; expected one of '
                       f'{agents.KINDS}.')
    if self.env is not None and not isinstance(self.env, str):
      raise ValueError(f'env must be an environment name or None (the '
                       f"starter's), got {self.env!r}.")
    if isinstance(self.seed, bool) or not isinstance(self.seed,
                                                     numbers.Integral):
      raise ValueError(f'seed must be an integer, got {self.seed!r}.')


@gin.configurable
@dataclasses.dataclass(frozen=True)
class StarterUse:
  """Which starter buffer, and how its data is used (only ever read).

  Attributes:
    starter_dir: a starter buffer (from the populate command).
    starter_mode: 'copy' (the run's buffer starts as a copy of it), 'mix'
      (served read-only beside the run's buffer, a share of each batch) or
      'none' (only its spec and environment are used).
    starter_fraction: 'mix': the starter's share of each batch at train step
      0, in [0, 1] (None: 0.5).
    starter_fraction_final: 'mix': the share to anneal to (None: fixed).
    starter_fraction_steps: 'mix': train steps over which it is annealed.
    starter_fraction_schedule: 'linear' or 'exponential' (see
      `FractionSchedule`).
    schedule: not an argument: the `FractionSchedule` made from the fields
      for 'mix', None otherwise.

  Raises:
    ValueError: on an unknown mode, a fraction given outside 'mix', or an
      invalid schedule (names the fields and their values).
  """
  starter_dir: Union[str, os.PathLike]
  starter_mode: str = 'copy'
  starter_fraction: Optional[float] = None
  starter_fraction_final: Optional[float] = None
  starter_fraction_steps: Optional[int] = None
  starter_fraction_schedule: str = 'linear'
  schedule: Optional[schedule_lib.FractionSchedule] = dataclasses.field(
      init=False, repr=False, compare=False)

  def __post_init__(self):
    _path('starter_dir', self.starter_dir)
    object.__setattr__(self, 'schedule', self._schedule())

  def _schedule(self) -> Optional[schedule_lib.FractionSchedule]:
    mode = self.starter_mode
    if mode not in MODES:
      raise ValueError(f'starter_mode must be one of {MODES}, got {mode!r}.')
    initial, final = self.starter_fraction, self.starter_fraction_final
    steps, kind = self.starter_fraction_steps, self.starter_fraction_schedule
    if mode != 'mix':
      given = {'starter_fraction': initial, 'starter_fraction_final': final,
               'starter_fraction_steps': steps}
      set_ = ', '.join(f'{k}={v}' for k, v in given.items() if v is not None)
      if set_:
        raise ValueError(f"{set_}: only for starter_mode='mix', got "
                         f'starter_mode={mode!r}.')
      return None
    try:
      return schedule_lib.FractionSchedule(
          initial=0.5 if initial is None else initial, final=final,
          steps=steps, kind=kind)
    except ValueError as e:
      raise ValueError(f'starter_fraction={initial}, starter_fraction_final='
                       f'{final}, starter_fraction_steps={steps}, '
                       f'starter_fraction_schedule={kind!r}: {e}') from None


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TrainLoop:
  """The collect + train loop and its intervals; all counts in train steps
  unless named otherwise.

  Attributes:
    num_train_steps: the train step to reach.
    collect_steps_per_iteration: actor (environment) steps per collect
      phase.
    train_steps_per_iteration: learner steps per train phase (also the
      Learner's summary interval).
    batch_size: the training batch size.
    checkpoint_every: train steps between paired agent/buffer checkpoints.
    eval_episodes: greedy evaluation episodes at the end, and every
      `eval_interval` train steps (0: no evaluation).
    eval_interval: train steps between evaluations during the run (0: only
      at the end).

  Raises:
    ValueError: naming the first bad field and its value.
  """
  num_train_steps: int = 2000
  collect_steps_per_iteration: int = 100
  train_steps_per_iteration: int = 100
  batch_size: int = 64
  checkpoint_every: int = 500
  eval_episodes: int = 5
  eval_interval: int = 0

  def __post_init__(self):
    for name in ('num_train_steps', 'collect_steps_per_iteration',
                 'train_steps_per_iteration', 'batch_size',
                 'checkpoint_every'):
      checks.positive(name, getattr(self, name), integer=True)
    _non_negative_int('eval_interval', self.eval_interval,
                      'evaluate at the end only')
    _non_negative_int('eval_episodes', self.eval_episodes, 'no evaluation')

  @property
  def samples_per_iteration(self) -> int:
    """Items sampled per train phase."""
    return self.train_steps_per_iteration * self.batch_size

  def train_steps_from(self, step: int) -> int:
    """Learner steps of the train phase that starts at train step `step`."""
    return min(self.train_steps_per_iteration, self.num_train_steps - step)

  def evaluates_after(self, step: int) -> bool:
    """Whether the phase that reached `step` is followed by an evaluation.

    Every `eval_interval` train steps (the first phase end at or past each
    multiple); the last step's evaluation is the final one, not this.
    """
    return bool(self.eval_interval and step < self.num_train_steps and
                step % self.eval_interval < self.train_steps_per_iteration)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RunOutput:
  """Where the run writes, and how it shows its progress.

  Attributes:
    run_dir: the run's directory (made absolute); see the layout in
      `training`'s module docstring.
    resume: continue `run_dir` from its newest agent/buffer pair.
    overwrite: replace an existing run instead of refusing.
    show_progress: draw a progress bar (train steps with rate and ETA, env
      steps, episodes, recent return) instead of log lines.
    log_every_s: seconds between progress log lines (without a bar).

  Raises:
    ValueError: naming the first bad field and its value, or if both
      `resume` and `overwrite` are set.
  """
  run_dir: Union[str, os.PathLike]
  resume: bool = False
  overwrite: bool = False
  show_progress: bool = False
  log_every_s: float = 10.0

  def __post_init__(self):
    _path('run_dir', self.run_dir)
    object.__setattr__(self, 'run_dir', os.path.abspath(self.run_dir))
    if (isinstance(self.log_every_s, bool) or
        not isinstance(self.log_every_s, numbers.Real) or
        not self.log_every_s >= 0):
      raise ValueError(f'log_every_s must be a non-negative number of '
                       f'seconds, got {self.log_every_s!r}.')
    if self.resume and self.overwrite:
      raise ValueError('resume and overwrite exclude each other.')

  @property
  def buffer_dir(self) -> str:
    """`<run_dir>/buffer`: the run's replay buffer."""
    return os.path.join(self.run_dir, BUFFER_DIR)

  @property
  def agent_dir(self) -> str:
    """`<run_dir>/agent`: agent checkpoints `ckpt-<train_step>`."""
    return os.path.join(self.run_dir, AGENT_DIR)

  @property
  def summary_dir(self) -> str:
    """`<run_dir>/train`: the Learner's TensorBoard event file."""
    return os.path.join(self.run_dir, SUMMARY_DIR)

  @property
  def eval_dir(self) -> str:
    """`<run_dir>/eval`: TensorBoard of TF-Agents' eval actor."""
    return os.path.join(self.run_dir, EVAL_DIR)


# Made in this order from flat fields, so that of several bad arguments the
# first one named is the one `train_from_starter` always named first.
_GROUPS = (('loop', TrainLoop), ('output', RunOutput), ('starter', StarterUse),
           ('agent_setup', AgentSetup))


def field_names(group: type) -> Tuple[str, ...]:
  """The arguments a group takes (its fields, without derived ones)."""
  return tuple(f.name for f in dataclasses.fields(group) if f.init)


FIELD_NAMES = frozenset(name for _, group in _GROUPS
                        for name in field_names(group))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything `train_from_starter` is asked to do, checked.

  Attributes:
    agent_setup: what to train.
    starter: which starter, and how it is used.
    loop: the loop and its intervals.
    output: where the run writes.

  Raises:
    ValueError: if a group is not of its type.
  """
  agent_setup: AgentSetup
  starter: StarterUse
  loop: TrainLoop
  output: RunOutput

  def __post_init__(self):
    for name, group in _GROUPS:
      value = getattr(self, name)
      if not isinstance(value, group):
        raise ValueError(f'{name} must be a {group.__name__}, got '
                         f'{value!r}.')

  @classmethod
  def from_fields(cls, **fields: Any) -> 'TrainConfig':
    """Builds the groups from their flat fields.

    A field not given takes its gin binding (`TrainLoop.batch_size = 256`),
    else the group's default; one given here wins over gin.

    Args:
      **fields: fields of the groups, by name (`starter_dir` and `run_dir`
        are required, unless bound in gin).

    Returns:
      The `TrainConfig`.

    Raises:
      TypeError: if a field is unknown (names it and lists the fields).
      ValueError: naming the first bad field and its value.
    """
    unknown = sorted(set(fields) - FIELD_NAMES)
    if unknown:
      raise TypeError(f'train_from_starter got unknown arguments {unknown}; '
                      f'its arguments are {sorted(FIELD_NAMES)} (and '
                      'stop_requested).')
    return cls(**{name: group(**{f: fields[f] for f in field_names(group)
                                 if f in fields})
                  for name, group in _GROUPS})
