"""A buffer's configuration: one frozen record of what the buffer is.

`BufferConfig` is the one immutable record of what a buffer is: its step
spec, capacity, default sequence and stride length, and resolved table
configs. It is what a checkpoint's manifest stores (`to_manifest`), what a
load compares with the manifest (`diff`), and where the manager looks tables
up (`table`, `prioritized_table`).
"""

import dataclasses
import functools
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from smart_replay.config import record
from smart_replay.config import tables as tables_lib
from smart_replay.layouts import frame_cells
from smart_replay import layouts
from smart_replay.layouts import packed_steps
from smart_replay.spec import specs

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
      'columns' (one Reverb column per field); see `packed_steps.Layout`.
    frame_stack: the stacked pixel field stored once per frame (packed
      layout only; see `layouts.frame_cells`), or None.
    writer_ids: whether each stored step carries its writer's id and
      sequence number (packed layout only; `packed_steps.StepCodec`). Not a
      user's choice: new packed buffers have them, a loaded buffer keeps
      what its checkpoint has.
  """
  data_spec: Any
  capacity: int
  sequence_length: int
  stride_length: int
  tables: Tuple[tables_lib.TableConfig, ...]
  layout: str = 'columns'
  frame_stack: Optional[frame_cells.FrameStack] = None
  writer_ids: bool = False

  @classmethod
  def resolve(cls, *, data_spec: Any, capacity: int, sequence_length: int,
              stride_length: int,
              table_configs: Sequence[tables_lib.TableConfig],
              layout: Optional[str] = None,
              frame_stack: Union[frame_cells.FrameStack, None, bool] = None,
              writer_ids: Optional[bool] = None) -> 'BufferConfig':
    """Fills every table config's open fields with the buffer's values.

    Args:
      data_spec: the spec of one step.
      capacity: the default `max_size`.
      sequence_length: the default steps per item.
      stride_length: the default stride.
      table_configs: the tables, as the user wrote them.
      layout: 'packed' or 'columns'; None for `packed_steps.default_layout`
        ('packed' with a `frame_stack`).
      frame_stack: a stacked pixel field to store once per frame; None to
        find one (`frame_cells.detect_frame_stack`, unless the layout is
        'columns' or cannot be 'packed'); False for none.
      writer_ids: whether steps carry writer ids; None: a 'packed' layout
        has them.

    Returns:
      A `BufferConfig` with resolved tables.

    Raises:
      ValueError: if a table cannot be resolved (see `TableConfig.resolve`),
        or the layout is unknown or cannot store `data_spec` (names the
        field).
    """
    if frame_stack is None and layout in (None, 'packed') and (
        layout or packed_steps.default_layout(data_spec)) == 'packed':
      frame_stack = frame_cells.detect_frame_stack(data_spec)
    frame_stack = frame_stack or None  # False: none.
    layout = layout or ('packed' if frame_stack is not None else
                        packed_steps.default_layout(data_spec))
    config = cls(data_spec=data_spec, capacity=capacity,
                 sequence_length=sequence_length, stride_length=stride_length,
                 tables=tuple(c.resolve(capacity=capacity,
                                        sequence_length=sequence_length,
                                        stride_length=stride_length)
                              for c in table_configs),
                 layout=layout, frame_stack=frame_stack,
                 writer_ids=(layout == 'packed' if writer_ids is None else
                             bool(writer_ids)))
    config.step_layout  # Checks the layout now, before anything starts.
    for table in config.tables:
      if table.block_length is not None and config.layout != 'packed':
        raise ValueError(
            f'TableConfig({table.name!r}).block_length='
            f'{table.block_length} needs layout=\'packed\' (packed items '
            f'are blocks of packed steps), got layout={config.layout!r}.')
    return config

  @functools.cached_property
  def step_layout(self) -> packed_steps.Layout:
    """The `packed_steps.Layout` of `layout`: what Reverb stores per step, and
    how samples and checkpoint items decode."""
    return layouts.make_layout(self.layout, self.data_spec, self.frame_stack,
                               writer_ids=self.writer_ids)

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
        layout=packed_steps.stored_name(stored),
        frame_stack=layouts.stored_frame_stack(stored) or False,
        writer_ids=stored_writer_ids(stored))

  def constructor_kwargs(self) -> Dict[str, Any]:
    """The `ReplayBufferManager` arguments this config decides.

    Returns:
      `{'capacity', 'sequence_length', 'stride_length', 'table_configs',
      'layout', 'frame_stack'}` (`frame_stack` False for none, so that it is
      not looked for again).
    """
    return {'capacity': self.capacity, 'sequence_length': self.sequence_length,
            'stride_length': self.stride_length,
            'table_configs': list(self.tables), 'layout': self.layout,
            'frame_stack': self.frame_stack or False}

  def with_writer_ids_of(self, stored: Mapping[str, Any]) -> 'BufferConfig':
    """This config, with writer ids as a stored config has them (a loaded
    or served buffer keeps its own).

    Args:
      stored: a manifest or `record.build_config` dict.

    Returns:
      A `BufferConfig` (this one if nothing changes).
    """
    writer_ids = stored_writer_ids(stored) and self.layout == 'packed'
    if writer_ids == self.writer_ids:
      return self
    return dataclasses.replace(self, writer_ids=writer_ids)

  @functools.cached_property
  def _manifest(self) -> Dict[str, Any]:
    return record.build_config(
        data_spec=self.data_spec, sequence_length=self.sequence_length,
        stride_length=self.stride_length, capacity=self.capacity,
        table_configs=list(self.tables), layout=self.step_layout.describe())

  def to_manifest(self) -> Dict[str, Any]:
    """The config as a manifest stores it (JSON-serializable).

    Returns:
      `{'data_spec', 'sequence_length', 'stride_length', 'capacity',
      'tables', 'layout'}` (see `record.build_config`); the same dict
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
    return record.diff_config(stored, self.to_manifest())

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


def stored_writer_ids(stored: Mapping[str, Any]) -> bool:
  """Whether a stored config's steps carry writer ids.

  Args:
    stored: a manifest or `record.build_config` dict.

  Returns:
    True if its layout records `writer_ids` (buffers written before writer
    ids existed have none).
  """
  return 'writer_ids' in packed_steps.stored_layout(stored)
