"""Where a `ReplayBufferManager`'s Reverb server lives.

`LocalBackend` owns an in-process server and the buffer directory (create,
restore, checkpoint); `RemoteBackend` is a client of a standalone server
(`smart-replay-serve`) and asks it over the control channel. Both implement
`Backend`, so the manager never asks which mode it is in.
"""

from typing import Any, Optional, Sequence

from smart_replay.backends import base
from smart_replay.backends import local
from smart_replay.backends import remote
from smart_replay.core import config as config_lib


def make_backend(data_spec: Any, *, hooks: base.Hooks,
                 server_address: Optional[str], capacity: Optional[int],
                 sequence_length: Optional[int], stride_length: Optional[int],
                 table_configs: Optional[Sequence[Any]],
                 configs: Sequence[Any], layout: Optional[str],
                 checkpoint_dir: Optional[str],
                 keep_checkpoints: int, port: Optional[int],
                 control_address: Optional[str], connect_timeout_s: float,
                 checkpoint_timeout_s: float,
                 allow_version_mismatch: bool,
                 frame_stack: Optional[Any] = None) -> base.Backend:
  """The backend of a manager's (checked) arguments.

  Args:
    data_spec: the spec of one step.
    hooks: what the backend may ask of the manager.
    server_address: client mode's server, or None for a local server.
    capacity: the default table size (None: the server's, client mode).
    sequence_length: steps per item (None: 2, or the server's).
    stride_length: steps between item starts (None: 1, or the server's).
    table_configs: the tables as given (None: the server's, client mode).
    configs: the tables to serve locally (the default table if none given).
    layout: 'packed' or 'columns'; None for a loaded checkpoint's or the
      server's layout, and `packing.default_layout` for a new buffer.
    checkpoint_dir: the local buffer directory.
    keep_checkpoints: complete checkpoints to keep locally.
    port: the local server's port, or None.
    control_address: client mode's control service, or None for the default.
    connect_timeout_s: how long the server may take to answer.
    checkpoint_timeout_s: how long a save may take.
    allow_version_mismatch: load checkpoints of other package versions.
    frame_stack: the stacked pixel field (`frames.FrameStack`), or None:
      a loaded checkpoint's (or the server's), none for a new buffer.

  Returns:
    A `RemoteBackend` if `server_address` is set, else a `LocalBackend`.

  Raises:
    ValueError: if the local configuration cannot be resolved or
      `keep_checkpoints` is invalid.
  """
  if server_address is not None:
    return remote.RemoteBackend(
        data_spec, requested={
            'capacity': capacity, 'sequence_length': sequence_length,
            'stride_length': stride_length,
            'table_configs': list(table_configs) if table_configs else None,
            'layout': layout, 'frame_stack': frame_stack},
        server_address=server_address, control_address=control_address,
        connect_timeout_s=connect_timeout_s,
        checkpoint_timeout_s=checkpoint_timeout_s, hooks=hooks)
  config = config_lib.BufferConfig.resolve(
      data_spec=data_spec, capacity=capacity,
      sequence_length=sequence_length or 2, stride_length=stride_length or 1,
      table_configs=configs, layout=layout, frame_stack=frame_stack)
  return local.LocalBackend(
      config, layout_given=layout is not None or frame_stack is not None,
      checkpoint_dir=checkpoint_dir,
      keep_checkpoints=keep_checkpoints,
      port=port, connect_timeout_s=connect_timeout_s,
      checkpoint_timeout_s=checkpoint_timeout_s,
      allow_version_mismatch=allow_version_mismatch, hooks=hooks)
