"""Where a `ReplayBufferManager`'s Reverb server lives.

`LocalBackend` owns an in-process server and the buffer directory (create,
restore, checkpoint); `RemoteBackend` is a client of a standalone server
(`smart-replay-serve`) and asks it over the control channel. Both implement
`Backend`, so the manager never asks which mode it is in.
"""

from typing import Any

from smart_replay.backends import base
from smart_replay.backends import local
from smart_replay.backends import remote
from smart_replay.backends import sharded
from smart_replay.config import buffer as config_lib
from smart_replay.config import options


def make_backend(data_spec: Any, *, shape: options.BufferShape,
                 location: options.Location,
                 timeouts: options.Timeouts) -> base.Backend:
  """The backend of where the buffer lives.

  Args:
    data_spec: the spec of one step.
    shape: what the buffer is (None fields: the defaults for a new local
      buffer, a loaded checkpoint's, or the server's).
    location: a `LocalBuffer` or a `RemoteBuffer`.
    timeouts: `connect_timeout_s` and `checkpoint_timeout_s` are used.

  Returns:
    A `RemoteBackend` for a `RemoteBuffer` of one server, a
    `ShardedBackend` for one of several, else a `LocalBackend`.

  Raises:
    ValueError: if the local configuration cannot be resolved.
  """
  if isinstance(location, options.RemoteBuffer):
    backend = (sharded.ShardedBackend if len(location.addresses) > 1 else
               remote.RemoteBackend)
    return backend(data_spec, shape=shape, location=location,
                   timeouts=timeouts)
  config = config_lib.BufferConfig.resolve(
      data_spec=data_spec, capacity=shape.capacity,
      sequence_length=shape.sequence_length or 2,
      stride_length=shape.stride_length or 1, table_configs=list(shape.tables),
      layout=shape.layout, frame_stack=shape.frame_stack)
  return local.LocalBackend(
      config, layout_given=shape.layout is not None or (
          shape.frame_stack is not None), location=location,
      timeouts=timeouts)
