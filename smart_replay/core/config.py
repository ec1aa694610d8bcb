"""A buffer's configuration, and the checks of the manager's arguments.

`BufferConfig` is the one immutable record of what a buffer is: its step
spec, capacity, default sequence and stride length, and resolved table
configs. It is what a checkpoint's manifest stores (`to_manifest`), what a
load compares with the manifest (`diff`), and where the manager looks tables
up (`table`, `prioritized_table`).
"""

import dataclasses
import functools
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from smart_replay.checkpointing import layout
from smart_replay.checkpointing import manifest as manifest_lib
from smart_replay.core import checks
from smart_replay.core import frames as frames_lib
from smart_replay.core import layouts
from smart_replay.core import packing
from smart_replay.core import specs
from smart_replay.core import tables as tables_lib
from smart_replay.core import validation as step_validation

Difference = Tuple[str, Any, Any]


@dataclasses.dataclass(frozen=True, eq=False)
class BufferConfig:
  """What a buffer is: spec, capacity, lengths and resolved table configs.

  Build it with `resolve` (from user arguments) or `from_manifest` (from a
  stored config); the constructor takes the fields as they are.

  Attributes:
    data_spec: the spec of one step (a `Trajectory` of specs).
    capacity: items of every table without its own `max_size`.
    sequence_length: steps per item of sequence tables without their own.
    stride_length: steps between item starts, likewise.
    tables: the resolved `TableConfig`s; the first is the default table.
    layout: how steps are stored: 'packed' (one byte column per step) or
      'columns' (one Reverb column per field); see `packing.Layout`.
    frame_stack: the stacked pixel field stored once per frame (packed
      layout only; see `frames`), or None.
  """
  data_spec: Any
  capacity: int
  sequence_length: int
  stride_length: int
  tables: Tuple[tables_lib.TableConfig, ...]
  layout: str = 'columns'
  frame_stack: Optional[frames_lib.FrameStack] = None

  @classmethod
  def resolve(cls, *, data_spec: Any, capacity: int, sequence_length: int,
              stride_length: int,
              table_configs: Sequence[tables_lib.TableConfig],
              layout: Optional[str] = None,
              frame_stack: Optional[frames_lib.FrameStack] = None
              ) -> 'BufferConfig':
    """Fills every table config's open fields with the buffer's values.

    Args:
      data_spec: the spec of one step.
      capacity: the default `max_size`.
      sequence_length: the default steps per item.
      stride_length: the default stride.
      table_configs: the tables, as the user wrote them.
      layout: 'packed' or 'columns'; None for `packing.default_layout`
        ('packed' with a `frame_stack`).
      frame_stack: a stacked pixel field to store once per frame, or None.

    Returns:
      A `BufferConfig` with resolved tables.

    Raises:
      ValueError: if a table cannot be resolved (see `TableConfig.resolve`),
        or the layout is unknown or cannot store `data_spec` (names the
        field).
    """
    config = cls(data_spec=data_spec, capacity=capacity,
                 sequence_length=sequence_length, stride_length=stride_length,
                 tables=tuple(c.resolve(capacity=capacity,
                                        sequence_length=sequence_length,
                                        stride_length=stride_length)
                              for c in table_configs),
                 layout=layout or ('packed' if frame_stack is not None else
                                   packing.default_layout(data_spec)),
                 frame_stack=frame_stack)
    config.step_layout  # Checks the layout now, before anything starts.
    for table in config.tables:
      if table.block_length is not None and config.layout != 'packed':
        raise ValueError(
            f'TableConfig({table.name!r}).block_length='
            f'{table.block_length} needs layout=\'packed\' (packed items '
            f'are blocks of packed steps), got layout={config.layout!r}.')
    return config

  @functools.cached_property
  def step_layout(self) -> packing.Layout:
    """The `packing.Layout` of `layout`: what Reverb stores per step, and
    how samples and checkpoint items decode."""
    return layouts.make_layout(self.layout, self.data_spec, self.frame_stack)

  @classmethod
  def from_manifest(cls, stored: Mapping[str, Any], *,
                    data_spec: Any = None) -> 'BufferConfig':
    """Reads the config a manifest (or a served `info`) stores.

    Args:
      stored: a manifest, or what `to_manifest` returned.
      data_spec: the step spec to use; default the stored one.

    Returns:
      The `BufferConfig`.

    Raises:
      KeyError, TypeError, ValueError: if `stored` is not such a config.
    """
    if data_spec is None:
      data_spec = specs.spec_from_json(stored['data_spec'])
    return cls.resolve(
        data_spec=data_spec, capacity=stored['capacity'],
        sequence_length=stored['sequence_length'],
        stride_length=stored['stride_length'],
        table_configs=[tables_lib.TableConfig(**t) for t in stored['tables']],
        layout=packing.stored_name(stored),
        frame_stack=layouts.stored_frame_stack(stored))

  def constructor_kwargs(self) -> Dict[str, Any]:
    """The `ReplayBufferManager` arguments this config decides.

    Returns:
      `{'capacity', 'sequence_length', 'stride_length', 'table_configs',
      'layout', 'frame_stack'}`.
    """
    return {'capacity': self.capacity, 'sequence_length': self.sequence_length,
            'stride_length': self.stride_length,
            'table_configs': list(self.tables), 'layout': self.layout,
            'frame_stack': self.frame_stack}

  @functools.cached_property
  def _manifest(self) -> Dict[str, Any]:
    return manifest_lib.build_config(
        data_spec=self.data_spec, sequence_length=self.sequence_length,
        stride_length=self.stride_length, capacity=self.capacity,
        table_configs=list(self.tables), layout=self.step_layout.describe())

  def to_manifest(self) -> Dict[str, Any]:
    """The config as a manifest stores it (JSON-serializable).

    Returns:
      `{'data_spec', 'sequence_length', 'stride_length', 'capacity',
      'tables', 'layout'}` (see `manifest.build_config`); the same dict
      every call.
    """
    return self._manifest

  def diff(self, stored: Union['BufferConfig', Mapping[str, Any]]
           ) -> List[Difference]:
    """Lists every field where `stored` differs from this config.

    Args:
      stored: a manifest (or another `BufferConfig`), e.g. a checkpoint's.

    Returns:
      `(field, stored_value, this_value)` tuples; empty when they match.
      Sampling-only table fields (beta, epsilon) are not compared.
    """
    if isinstance(stored, BufferConfig):
      stored = stored.to_manifest()
    return manifest_lib.diff_config(stored, self.to_manifest())

  @property
  def table_names(self) -> List[str]:
    """The tables' names, the default table first."""
    return [c.name for c in self.tables]

  def table(self, name: Optional[str] = None) -> tables_lib.TableConfig:
    """The config of table `name`.

    Args:
      name: a table name; None for the first table.

    Returns:
      Its resolved `TableConfig`.

    Raises:
      ValueError: if there is no such table; names the tables there are.
    """
    if name is None:
      return self.tables[0]
    for config in self.tables:
      if config.name == name:
        return config
    raise ValueError(f'unknown table_name {name!r}; this buffer has '
                     f'tables {self.table_names}.')

  def prioritized_table(self, name: Optional[str] = None
                        ) -> tables_lib.TableConfig:
    """The config of prioritized table `name`.

    Args:
      name: a table name; None for the first prioritized table.

    Returns:
      Its resolved `TableConfig`.

    Raises:
      ValueError: if the table is unknown or not prioritized, or (name None)
        there is no prioritized table.
    """
    if name is None:
      found = [c for c in self.tables if c.prioritized]
      if not found:
        raise ValueError(
            'this buffer has no prioritized table (tables '
            f'{[(c.name, c.sampler) for c in self.tables]}); add a '
            "TableConfig(sampler='prioritized').")
      return found[0]
    config = self.table(name)
    if not config.prioritized:
      raise ValueError(f'table {config.name!r} samples {config.sampler!r}, '
                       "not 'prioritized': priorities would not change what "
                       'is sampled.')
    return config


def from_checkpoint_arguments(source: str, checkpoint_dir: Optional[str],
                              kwargs: Mapping[str, Any]) -> Dict[str, Any]:
  """`ReplayBufferManager` arguments configured like the newest checkpoint.

  Args:
    source: a buffer directory or one `ckpt-N` folder.
    checkpoint_dir: where the manager writes; None for the buffer directory
      of `source`.
    kwargs: the caller's other manager arguments.

  Returns:
    `kwargs` with `data_spec`, `checkpoint_dir`, `capacity`,
    `sequence_length`, `stride_length`, `table_configs` and `layout` added
    from the
    newest checkpoint with a readable manifest.

  Raises:
    ValueError: if `kwargs` sets something the manifest decides.
    CheckpointNotFoundError: if there is no checkpoint at `source`.
    CheckpointCorruptError: if no checkpoint there has a readable manifest.
  """
  controlled = sorted(set(kwargs) & {'data_spec', 'capacity',
                                     'sequence_length', 'stride_length',
                                     'table_configs', 'layout'})
  if controlled:
    raise ValueError(f'from_checkpoint reads {controlled} from the '
                     "checkpoint's manifest; do not pass them (construct "
                     'ReplayBufferManager directly to change them).')
  candidates = layout.find_checkpoints(source)
  stored = layout.first_usable(candidates, layout.read_manifest,
                               failure=f'no readable manifest in {source}')
  config = BufferConfig.from_manifest(stored)
  return {'data_spec': config.data_spec,
          'checkpoint_dir': checkpoint_dir or layout.buffer_dir_of(
              candidates[0]), **config.constructor_kwargs(), **kwargs}


def check_manager_arguments(
    *, server_address: Optional[str], capacity: Optional[int],
    checkpoint_dir: Optional[str], port: Optional[int],
    lengths: Mapping[str, Optional[int]], timeouts: Mapping[str, float],
    table_configs: Optional[Sequence[tables_lib.TableConfig]],
    layout: Optional[str], counts: Mapping[str, Optional[int]],
    policies: Mapping[str, str],
    frame_stack: Optional[frames_lib.FrameStack] = None
) -> List[tables_lib.TableConfig]:
  """Checks `ReplayBufferManager`'s arguments; names the first bad one.

  Args:
    server_address: client mode's 'host:port', or None for a local server.
    capacity: the default table size (required for a local server).
    checkpoint_dir: the buffer directory (required for a local server).
    port: the local server's port, or None.
    lengths: `{'capacity', 'sequence_length', 'stride_length'}` values
      (None: not given).
    timeouts: `{name: seconds}`, each must be positive.
    table_configs: the tables, or None for one default table.
    layout: 'packed', 'columns' or None (see `ReplayBufferManager`).
    counts: optional positive integers, e.g. `{'num_envs': None}`.
    policies: `{'non_finite': ..., 'float_bounds': ...}` value policies.
    frame_stack: a `FrameStack` or None (needs the packed layout).

  Returns:
    The table configs to use (the default table if none were given).

  Raises:
    ValueError: naming the argument and its value.
  """
  remote = server_address is not None
  if remote:
    if not isinstance(server_address, str) or ':' not in server_address:
      raise ValueError(f"server_address must be 'host:port', got "
                       f'{server_address!r}.')
    if checkpoint_dir is not None or port is not None:
      raise ValueError(
          f'client mode (server_address={server_address!r}) has no local '
          f'server: checkpoint_dir ({checkpoint_dir!r}) and port '
          f'({port!r}) belong to smart-replay-serve; leave them None.')
  elif capacity is None or checkpoint_dir is None:
    raise ValueError(
        f'capacity ({capacity!r}) and checkpoint_dir ({checkpoint_dir!r}) '
        'are required, unless server_address= connects to a standalone '
        'server (binaries: bind ReplayBufferManager.capacity in a gin '
        'file).')
  for name, value in lengths.items():
    if value is not None:
      checks.positive(name, value, integer=True)
  for name, value in timeouts.items():
    checks.positive(name, value)
  if not remote and (not isinstance(checkpoint_dir, (str, os.PathLike)) or
                     not str(checkpoint_dir)):
    raise ValueError(f'checkpoint_dir must be a non-empty path, got '
                     f'{checkpoint_dir!r}.')
  configs = list(table_configs or [tables_lib.TableConfig()])
  for config in configs:
    if not isinstance(config, tables_lib.TableConfig):
      raise ValueError(f'table_configs entries must be TableConfig, got '
                       f'{config!r}.')
  if layout is not None and layout not in packing.LAYOUTS:
    raise ValueError(f'layout must be one of {packing.LAYOUTS} or None, got '
                     f'{layout!r}.')
  if frame_stack is not None and not isinstance(frame_stack,
                                                frames_lib.FrameStack):
    raise ValueError(f'frame_stack must be a smart_replay.FrameStack(field, '
                     f'axis) or None, got {frame_stack!r}.')
  if frame_stack is not None and layout == 'columns':
    raise ValueError(f"frame_stack={frame_stack!r} needs layout='packed' (or "
                     f"None), got layout={layout!r}.")
  names = [c.name for c in configs]
  if len(set(names)) != len(names):
    raise ValueError(f'table_configs names must be unique, got {names}.')
  for name, value in counts.items():
    if value is not None:
      checks.positive(name, value, integer=True)
  for name, value in policies.items():
    if value not in step_validation.VALUE_POLICIES:
      raise ValueError(f'{name} must be one of '
                       f'{step_validation.VALUE_POLICIES}, got {value!r}.')
  return configs
