"""The benchmark workload: its settings, its step spec and its steps.

Every compared path writes the same deterministic stream of TF-Agents
`Trajectory` steps (observation float32[N], action float32[4], reward,
discount and step types) into a table of items of 2 steps, stride 1.
"""

import dataclasses
from typing import Any, List, Optional

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib
import tree

from smart_replay.core import tables as tables_lib

TABLE = 'replay'
SEQUENCE_LENGTH = 2


@dataclasses.dataclass(frozen=True)
class Workload:
  """What the benchmark writes and samples.

  Attributes:
    steps: steps written into each compared buffer (checkpoint and memory are
      measured on buffers of this many steps).
    repeats: alternating repeats; each writes `steps // repeats` steps per path.
    observation_size: floats per observation.
    observation: 'smooth' (sensor-like: slow sines plus noise, rounded to
      0.01) or 'noise' (standard normal floats, which do not compress).
    episode_length: steps per episode.
    num_envs: environments of the batched observer.
    batch_size: sampled items per batch.
    sample_batches: batches timed per sampling repeat.
    chunk_length: our observer's chunk length (None: automatic).
    seed: seed of the generated steps.
  """
  steps: int = 1_000_000
  repeats: int = 5
  observation_size: int = 32
  observation: str = 'smooth'
  episode_length: int = 200
  num_envs: int = 8
  batch_size: int = 256
  sample_batches: int = 200
  chunk_length: Optional[int] = None
  seed: int = 0

  def __post_init__(self):
    for name in ('steps', 'repeats', 'observation_size', 'num_envs',
                 'batch_size', 'sample_batches'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'Workload.{name} must be an integer >= 1, got '
                         f'{value!r}.')
    if self.episode_length < SEQUENCE_LENGTH:
      raise ValueError(f'Workload.episode_length must be >= {SEQUENCE_LENGTH} '
                       f'(the item length), got {self.episode_length!r}.')
    if self.observation not in ('smooth', 'noise'):
      raise ValueError(f"Workload.observation must be 'smooth' or 'noise', got "
                       f'{self.observation!r}.')
    if self.steps // self.repeats < self.num_envs * self.episode_length:
      raise ValueError(
          f'Workload.steps // repeats = {self.steps // self.repeats} steps per '
          f'repeat must cover at least one episode per environment '
          f'(num_envs * episode_length = '
          f'{self.num_envs * self.episode_length}).')

  @property
  def steps_per_repeat(self) -> int:
    """Steps each path writes per repeat."""
    return self.steps // self.repeats


def data_spec(observation_size: int) -> trajectory_lib.Trajectory:
  """The spec of one benchmark step (a TF-Agents `Trajectory`).

  Args:
    observation_size: floats per observation.

  Returns:
    The `Trajectory` of `tf.TensorSpec`s.
  """
  return trajectory_lib.Trajectory(
      step_type=tf.TensorSpec([], tf.int32, 'step_type'),
      observation=tf.TensorSpec([observation_size], tf.float32, 'observation'),
      action=tf.TensorSpec([4], tf.float32, 'action'),
      policy_info=(),
      next_step_type=tf.TensorSpec([], tf.int32, 'next_step_type'),
      reward=tf.TensorSpec([], tf.float32, 'reward'),
      discount=tf.TensorSpec([], tf.float32, 'discount'))


def raw_bytes_per_step(spec: Any) -> int:
  """Bytes of one step's tensors, without any framing.

  Args:
    spec: the step spec.

  Returns:
    The sum of every leaf's size in bytes.
  """
  return sum(s.dtype.size * s.shape.num_elements() for s in tree.flatten(spec))


def make_steps(workload: Workload, start: int, count: int,
               num_envs: Optional[int] = None
               ) -> List[trajectory_lib.Trajectory]:
  """A deterministic stream of steps: the same for the same arguments.

  Args:
    workload: the workload.
    start: index of the first step (episode boundaries follow the index).
    count: steps to make.
    num_envs: None for unbatched steps; else every step holds this many
      environments' steps (outer dimension), each its own stream.

  Returns:
    `count` numpy `Trajectory`s.
  """
  envs = num_envs or 1
  rng = np.random.default_rng([workload.seed, start, envs])
  index = np.arange(start, start + count)[None, :] + (
      np.arange(envs)[:, None] * 7919)  # [envs, count]
  position = index % workload.episode_length
  last = workload.episode_length - 1
  step_type = np.where(position == 0, 0, np.where(position == last, 2, 1))
  next_step_type = np.where(position == last - 1, 2,
                            np.where(position == last, 0, 1))
  shape = (envs, count, workload.observation_size)
  if workload.observation == 'noise':
    observation = rng.standard_normal(shape)
  else:
    phase = np.random.default_rng(workload.seed).uniform(
        0, 2 * np.pi, workload.observation_size)
    observation = np.round(20 + 5 * np.sin(index[..., None] / 50 + phase) +
                           0.05 * rng.standard_normal(shape), 2)
  fields = dict(
      step_type=step_type.astype(np.int32),
      observation=observation.astype(np.float32),
      action=rng.uniform(-1, 1, (envs, count, 4)).astype(np.float32),
      next_step_type=next_step_type.astype(np.int32),
      reward=rng.standard_normal((envs, count)).astype(np.float32),
      discount=np.where(position == last, 0, 1).astype(np.float32))
  if num_envs is None:
    fields = {k: v[0] for k, v in fields.items()}
  else:  # [count, envs, ...]
    fields = {k: np.ascontiguousarray(np.swapaxes(v, 0, 1))
              for k, v in fields.items()}
  return [trajectory_lib.Trajectory(
      policy_info=(), **{k: v[i] for k, v in fields.items()})
          for i in range(count)]


def table_config(capacity: int) -> tables_lib.TableConfig:
  """The benchmark table: items of `SEQUENCE_LENGTH` steps, stride 1.

  Args:
    capacity: the table's max_size.

  Returns:
    The resolved `TableConfig` named `TABLE`.
  """
  return tables_lib.TableConfig(name=TABLE).resolve(
      capacity=capacity, sequence_length=SEQUENCE_LENGTH, stride_length=1)
