"""The benchmark workload: its settings, its step spec, its steps and buffers.

Every compared path writes the same deterministic stream of TF-Agents
`Trajectory` steps (observation float32[N], or another shape and dtype;
action float32[4], reward, discount and step types) into a table of items of
2 steps, stride 1. `BUFFERS` are the compared buffers: how each stores a step
(`Buffer.layout`) and whether its items are blocks of steps
(`Buffer.block_length`); `make_server` starts a server with the benchmark table.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import reverb
import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib
import tree

from smart_replay.config import reverb_tables
from smart_replay.config import tables as tables_lib
from smart_replay.layouts import packed_steps

TABLE = 'replay'
SEQUENCE_LENGTH = 2
OBSERVATION_DTYPES = ('float32', 'uint8')


@dataclasses.dataclass(frozen=True)
class Workload:
  """What the benchmark writes and samples.

  Attributes:
    steps: steps written into each compared buffer (checkpoint and memory are
      measured on buffers of this many steps).
    repeats: alternating repeats; each writes `steps // repeats` steps per path.
    observation_size: floats per observation (when `observation_shape` is
      None).
    observation: 'smooth' (sensor-like: slow sines plus noise, rounded to
      0.01) or 'noise' (standard normal floats, which do not compress).
    episode_length: steps per episode.
    num_envs: environments of the batched observer.
    batch_size: sampled items per batch.
    sample_batches: batches timed per sampling repeat.
    chunk_length: our observer's chunk length (None: automatic).
    seed: seed of the generated steps.
    observation_shape: the observation's shape, e.g. (84, 84, 4); None for
      `(observation_size,)`.
    observation_dtype: 'float32', or 'uint8' (image-like: the values scaled
      to 0..255).
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
  observation_shape: Optional[Tuple[int, ...]] = None
  observation_dtype: str = 'float32'

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
    if self.observation_dtype not in OBSERVATION_DTYPES:
      raise ValueError(f'Workload.observation_dtype must be one of '
                       f'{OBSERVATION_DTYPES}, got {self.observation_dtype!r}.')
    if self.observation_shape is not None and (
        not self.observation_shape or
        any(isinstance(d, bool) or not isinstance(d, int) or d < 1
            for d in self.observation_shape)):
      raise ValueError(f'Workload.observation_shape must be a tuple of '
                       f'integers >= 1, got {self.observation_shape!r}.')
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

  @property
  def shape(self) -> Tuple[int, ...]:
    """The observation's shape."""
    return tuple(self.observation_shape or (self.observation_size,))

  @property
  def spec(self) -> trajectory_lib.Trajectory:
    """The spec of one step of this workload (see `data_spec`)."""
    return data_spec(self.observation_size, shape=self.observation_shape,
                     dtype=self.observation_dtype)

  def describe_observation(self) -> str:
    """The observation, e.g. 'float32[32] smooth' or 'uint8[84, 84, 4]'."""
    return (f'{self.observation_dtype}{list(self.shape)} '
            f'{self.observation}')


def data_spec(observation_size: int, *,
              shape: Optional[Tuple[int, ...]] = None,
              dtype: str = 'float32') -> trajectory_lib.Trajectory:
  """The spec of one benchmark step (a TF-Agents `Trajectory`).

  Args:
    observation_size: floats per observation (when `shape` is None).
    shape: the observation's shape; None for `(observation_size,)`.
    dtype: the observation's dtype ('float32' or 'uint8').

  Returns:
    The `Trajectory` of `tf.TensorSpec`s.
  """
  return trajectory_lib.Trajectory(
      step_type=tf.TensorSpec([], tf.int32, 'step_type'),
      observation=tf.TensorSpec(list(shape or (observation_size,)),
                                tf.as_dtype(dtype), 'observation'),
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
  size = int(np.prod(workload.shape))
  shape = (envs, count, size)
  if workload.observation == 'noise':
    observation = rng.standard_normal(shape)
  else:
    phase = np.random.default_rng(workload.seed).uniform(0, 2 * np.pi, size)
    observation = np.round(20 + 5 * np.sin(index[..., None] / 50 + phase) +
                           0.05 * rng.standard_normal(shape), 2)
  if workload.observation_dtype == 'uint8':  # Pixels, 0..255.
    observation = np.clip(128 + (observation - 20) * 20, 0, 255)
  observation = observation.reshape((envs, count) + workload.shape)
  fields = dict(
      step_type=step_type.astype(np.int32),
      observation=observation.astype(workload.observation_dtype),
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


def table_config(capacity: int, block_length: Optional[int] = None
                 ) -> tables_lib.TableConfig:
  """The benchmark table: windows of `SEQUENCE_LENGTH` steps, stride 1.

  Args:
    capacity: the table's max_size, in windows.
    block_length: packed items of this many steps; None: one item per
      window.

  Returns:
    The resolved `TableConfig` named `TABLE`.
  """
  return tables_lib.TableConfig(name=TABLE, block_length=block_length).resolve(
      capacity=capacity, sequence_length=SEQUENCE_LENGTH, stride_length=1)


@dataclasses.dataclass(frozen=True)
class Buffer:
  """How one compared buffer stores the stream.

  Attributes:
    layout: 'columns' (one Reverb column per field, as TF-Agents writes) or
      'packed' (one byte column per step).
    block_length: packed items of this many steps; None: one item per
      window.
  """
  layout: str = 'columns'
  block_length: Optional[int] = None

  def table(self, capacity: int) -> tables_lib.TableConfig:
    """The buffer's resolved table config (see `table_config`)."""
    return table_config(capacity, self.block_length)

  def step_layout(self, spec: Any) -> packed_steps.Layout:
    """The buffer's `packed_steps.Layout` for `spec` (packed rows carry
    writer ids, as a new packed buffer's do)."""
    return packed_steps.Layout(self.layout, spec,
                               ids=self.layout == 'packed')


# Packed items of 32 steps: 31 windows of 2 steps per block.
BLOCK_LENGTH = 32
BUFFERS: Dict[str, Buffer] = {
    'stock': Buffer(),                   # TF-Agents' observer writes it.
    'ours': Buffer('packed'),            # Our default layout.
    'ours_columns': Buffer('columns'),   # Our observer, one column per field.
    'blocks': Buffer('packed', BLOCK_LENGTH),
    'sink': Buffer('packed'),            # Batched and Reverb-floor writes.
}


def make_server(spec: Any, capacity: int, root: str,
                fallback: Optional[str] = None,
                buffer: Buffer = Buffer()
                ) -> reverb.Server:
  """A Reverb server, in this process, with one benchmark table.

  Args:
    spec: the step spec.
    capacity: the table's max_size (windows).
    root: the checkpoint root (must not hold a checkpoint).
    fallback: a checkpoint folder to restore, or None.
    buffer: how the buffer stores the stream (layout, packed items).

  Returns:
    The started server (restored from `fallback` if given).
  """
  return reverb.Server(
      [reverb_tables.make_table(buffer.table(capacity),
                                buffer.step_layout(spec).step_spec)],
      checkpointer=reverb.checkpointers.DefaultCheckpointer(
          root, fallback_checkpoint_path=fallback))
