"""zstd compression of string tensors inside the TensorFlow graph.

Thin wrappers over the compiled ops of `zstd_ops.cc`: `encode` turns each
element of a string tensor into one zstd frame (content size and checksum
recorded), `decode` inflates them back; both keep the tensor's shape, run in
`tf.data` maps (also with `num_parallel_calls`) and in `tf.function`s, and
are stateless. A bad blob is a `tf.errors.InvalidArgumentError` naming its
flat index (`blobs[i]`): empty, not one complete frame, damaged (checksum),
without a recorded content size, or larger than `max_size` decoded.

The library `_zstd_ops.so` sits next to this file. It is loaded on first use
(once; `tf.load_op_library` itself keeps loaded libraries), not on import.
If it was not built, every call raises `ZstdOpMissingError`, which says how
to build it; there is no fallback. `available()` asks without raising,
`require()` fails early.
"""

import numbers
import os
from typing import Any, Optional

from smart_replay import errors

LIBRARY_NAME = '_zstd_ops.so'
DEFAULT_MAX_SIZE = 64 << 20  # 64 MiB, the op's default.
DEFAULT_LEVEL = 3
_BUILD_HINT = ('Build it with `make ops` (which runs `python -m '
               'smart_replay.ops.build`); it needs g++ and the zstd headers: '
               'apt-get install g++ libzstd-dev.')

# The loaded op module, once `_load` succeeded.
_module: Optional[Any] = None


class ZstdOpMissingError(errors.SmartReplayError, ImportError):
  """The zstd op library is not built (or not loadable); says how to build."""


def library_path() -> str:
  """Returns the path the op library is loaded from."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      LIBRARY_NAME)


def _load() -> Any:
  """Loads the op library once and returns its module.

  Raises:
    ZstdOpMissingError: the library is missing or TensorFlow refuses it.
  """
  global _module
  if _module is not None:
    return _module
  path = library_path()
  if not os.path.exists(path):
    raise ZstdOpMissingError(
        f'The zstd TensorFlow op is not built: {path} is missing. '
        f'{_BUILD_HINT}')
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    module = tf.load_op_library(path)
  except (tf.errors.NotFoundError, OSError) as e:
    # An undefined symbol: built against another TensorFlow or zstd.
    raise ZstdOpMissingError(
        f'The zstd TensorFlow op at {path} does not load ({e}); rebuild it '
        f'for this TensorFlow {tf.__version__}: python -m '
        f'smart_replay.ops.build --force. {_BUILD_HINT}') from e
  _module = module
  return module


def available() -> bool:
  """Whether the zstd op is built and loads.

  Returns:
    True if `encode` and `decode` will run; loads the library if so.
  """
  try:
    _load()
  except ZstdOpMissingError:
    return False
  return True


def require() -> None:
  """Loads the zstd op, or fails with how to build it.

  Raises:
    ZstdOpMissingError: the library is not built or does not load; the
      message says how to build it.
  """
  _load()


def decode(blobs: Any, *, max_size: int = DEFAULT_MAX_SIZE) -> Any:
  """Decompresses each element of a string tensor of zstd frames.

  Args:
    blobs: a `tf.string` tensor (or something convertible to one) of any
      shape, each element one zstd frame with a recorded content size.
    max_size: the largest decoded element accepted, in bytes; a frame that
      declares more is refused before anything is allocated.

  Returns:
    A `tf.string` tensor of the same shape: the decoded bytes.

  Raises:
    ValueError: `max_size` is not an int >= 0.
    ZstdOpMissingError: the op is not built.
    tf.errors.InvalidArgumentError: when run, an element is empty, not
      exactly one zstd frame, damaged, without a recorded content size, or
      declares more than `max_size` bytes; the message names `blobs[i]`, its
      flat index.
  """
  if (isinstance(max_size, bool) or
      not isinstance(max_size, numbers.Integral) or max_size < 0):
    raise ValueError(f'max_size must be an int >= 0, got {max_size!r}')
  module = _load()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return module.smart_replay_zstd_decode(
      tf.convert_to_tensor(blobs, tf.string), max_size=int(max_size))


def encode(data: Any, *, level: int = DEFAULT_LEVEL) -> Any:
  """Compresses each element of a string tensor into one zstd frame.

  Each frame records its content size (so `decode` sizes its output) and an
  XXH64 checksum of the content (so damage is detected).

  Args:
    data: a `tf.string` tensor (or something convertible to one) of any
      shape.
    level: the zstd level, from zstd's minimum (negative: fastest) to its
      maximum (22); 0 means zstd's default (3).

  Returns:
    A `tf.string` tensor of the same shape: one zstd frame per element.

  Raises:
    ValueError: `level` is not an int.
    ZstdOpMissingError: the op is not built.
    tf.errors.InvalidArgumentError: `level` is outside zstd's range (raised
      when the op is constructed: at once in eager mode, else when run).
  """
  if isinstance(level, bool) or not isinstance(level, numbers.Integral):
    raise ValueError(f'level must be an int, got {level!r}')
  module = _load()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return module.smart_replay_zstd_encode(
      tf.convert_to_tensor(data, tf.string), level=int(level))
