"""The manager's arguments: grouped and checked once, or read from a checkpoint.

`group_options` turns `ReplayBufferManager`'s arguments, grouped
(`config.options`) or flat (gin bindings, keyword arguments), into one frozen
`ManagerOptions`, naming the first bad argument and its value before anything
starts; a local-only option with `server_address` (or the reverse) is
refused here, in one place. `from_checkpoint_arguments` configures a manager
like the newest checkpoint of a buffer directory.
"""

import dataclasses
from typing import Any, Dict, List, Mapping, Optional

from smart_replay.config import buffer as config_lib
from smart_replay.config import options as options_lib
from smart_replay.spec import specs
from smart_replay.storage import checkpoint_folders


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
    `sequence_length`, `stride_length`, `table_configs`, `layout` and
    `frame_stack` added from the newest checkpoint with a readable manifest.

  Raises:
    ValueError: if `kwargs` sets something the manifest decides.
    CheckpointNotFoundError: if there is no checkpoint at `source`.
    CheckpointCorruptError: if no checkpoint there has a readable manifest.
  """
  # The frame stack decides how the stored items are read, like the layout.
  controlled = sorted(set(kwargs) & {'data_spec', 'capacity', 'shape',
                                     'sequence_length', 'stride_length',
                                     'table_configs', 'layout',
                                     'frame_stack'})
  if controlled:
    raise ValueError(f'from_checkpoint reads {controlled} from the '
                     "checkpoint's manifest; do not pass them (construct "
                     'ReplayBufferManager directly to change them).')
  candidates = checkpoint_folders.find_checkpoints(source)
  stored = _first_manifest(candidates, failure=f'no readable manifest in '
                           f'{source}')
  config = config_lib.BufferConfig.from_manifest(stored)
  return {'data_spec': config.data_spec,
          'checkpoint_dir': checkpoint_dir or checkpoint_folders.buffer_dir_of(
              candidates[0]), **config.constructor_kwargs(), **kwargs}


def _first_manifest(candidates: List[str], *, failure: str) -> Dict[str, Any]:
  """The manifest of the first candidate whose manifest reads."""
  for attempt in checkpoint_folders.attempts(candidates, failure=failure):
    with attempt:
      return checkpoint_folders.read_manifest(attempt.path)


@dataclasses.dataclass(frozen=True)
class ManagerOptions:
  """Everything a `ReplayBufferManager` was asked for, checked.

  Attributes:
    data_spec: the spec of one step (a `Trajectory` of specs).
    shape: what the buffer is.
    location: a `LocalBuffer` or a `RemoteBuffer` (client mode).
    writes: how observers write.
    timeouts: how long waits may take.
  """
  data_spec: Any
  shape: options_lib.BufferShape
  location: options_lib.Location
  writes: options_lib.WriteOptions
  timeouts: options_lib.Timeouts

  @property
  def remote(self) -> bool:
    """Client mode: a server elsewhere holds the buffer."""
    return isinstance(self.location, options_lib.RemoteBuffer)

  @property
  def local(self) -> Optional[options_lib.LocalBuffer]:
    """The local buffer's options (None in client mode)."""
    return None if self.remote else self.location


_GROUPS = {'shape': options_lib.BufferShape, 'writes': options_lib.WriteOptions,
           'timeouts': options_lib.Timeouts}
_LOCAL = options_lib.field_names(options_lib.LocalBuffer)
_REMOTE = options_lib.field_names(options_lib.RemoteBuffer)
FLAT_NAMES = frozenset(
    _LOCAL + _REMOTE + sum((options_lib.field_names(g)
                            for g in _GROUPS.values()), ()))


def _group(name: str, given: Optional[Any], cls: type,
           flat: Mapping[str, Any]) -> Any:
  """The group `name`: as given, or made from its flat arguments."""
  fields = [f for f in options_lib.field_names(cls) if f in flat]
  if given is None:
    return cls(**{f: flat[f] for f in fields})
  if not isinstance(given, cls):
    raise ValueError(f'{name} must be a smart_replay {cls.__name__}, got '
                     f'{given!r}.')
  if fields:
    raise ValueError(f'{name}={given!r} and {fields} both set options of '
                     f'{cls.__name__}; give each option once.')
  return given


def _location(given: Optional[options_lib.Location], shape: Any,
              flat: Mapping[str, Any]) -> options_lib.Location:
  """Where the buffer lives: as given, or from the flat arguments."""
  named = [f for f in _LOCAL + _REMOTE if f in flat]
  if given is not None:
    if not isinstance(given, (options_lib.LocalBuffer,
                              options_lib.RemoteBuffer)):
      raise ValueError(f'location must be a smart_replay LocalBuffer or '
                       f'RemoteBuffer, got {given!r}.')
    if named:
      raise ValueError(f'location={given!r} and {named} both say where the '
                       f'buffer lives; give each option once.')
    location = given
  elif 'server_address' in flat:
    address = flat['server_address']
    local = {f: flat[f] for f in _LOCAL if f in flat and f not in _REMOTE}
    options_lib.RemoteBuffer(server_address=address)  # Checks the address.
    if local:
      raise ValueError(
          f'client mode (server_address={address!r}) has no local server: '
          f'{local} belong to smart-replay-serve (or to an in-process '
          'buffer); leave them None.')
    location = options_lib.RemoteBuffer(
        **{f: flat[f] for f in _REMOTE if f in flat})
  else:
    remote_only = [f'{f}={flat[f]!r}' for f in _REMOTE
                   if f in flat and f not in _LOCAL]
    if remote_only:
      raise ValueError(f'{", ".join(remote_only)}: for client mode; give '
                       'server_address= too.')
    if shape.capacity is None or flat.get('checkpoint_dir') is None:
      raise ValueError(
          f'capacity ({shape.capacity!r}) and checkpoint_dir '
          f'({flat.get("checkpoint_dir")!r}) are required, unless '
          'server_address= connects to a standalone server (binaries: '
          '--capacity, or bind ReplayBufferManager.capacity in a gin file).')
    location = options_lib.LocalBuffer(
        **{f: flat[f] for f in _LOCAL if f in flat})
  if isinstance(location, options_lib.LocalBuffer) and shape.capacity is None:
    raise ValueError(f'capacity ({shape.capacity!r}) is required for a local '
                     f'buffer ({location.checkpoint_dir!r}).')
  return location


def group_options(data_spec: Any, *,
                  shape: Optional[options_lib.BufferShape] = None,
                  location: Optional[options_lib.Location] = None,
                  writes: Optional[options_lib.WriteOptions] = None,
                  timeouts: Optional[options_lib.Timeouts] = None,
                  **flat: Any) -> ManagerOptions:
  """`ReplayBufferManager`'s arguments as one checked `ManagerOptions`.

  Args:
    data_spec: the spec of one step (a `Trajectory` of specs, or a nest
      TF-Agents' `collect_data_spec` gives).
    shape: what the buffer is, or None to build it from `flat`.
    location: a `LocalBuffer` or `RemoteBuffer`, or None: a `RemoteBuffer`
      if `flat` has `server_address`, else a `LocalBuffer`.
    writes: how observers write, or None to build it from `flat`.
    timeouts: the timeouts, or None to build them from `flat`.
    **flat: the flat arguments, each a field of one group (None: not given,
      the group's default).

  Returns:
    The `ManagerOptions`.

  Raises:
    TypeError: if a flat argument is not an option (names it).
    ValueError: naming the first bad argument and its value, or a
      combination that cannot work (e.g. `port` in client mode).
    TrajectorySpecError: if `data_spec` is not a valid step spec.
  """
  unknown = sorted(set(flat) - FLAT_NAMES)
  if unknown:
    raise TypeError(f'ReplayBufferManager got unknown arguments {unknown}; '
                    f'its options are {sorted(FLAT_NAMES)}.')
  flat = {k: v for k, v in flat.items() if v is not None}
  data_spec = specs.as_trajectory(data_spec)
  specs.validate_trajectory_spec(data_spec)
  groups = {name: _group(name, given, _GROUPS[name], flat) for name, given in
            (('shape', shape), ('writes', writes), ('timeouts', timeouts))}
  return ManagerOptions(data_spec=data_spec, location=_location(
      location, groups['shape'], flat), **groups)
