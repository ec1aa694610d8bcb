"""zstd compression of string tensors inside the TensorFlow graph.

Thin wrappers over the compiled ops of `zstd_ops.cc`: `encode` turns each
element of a string tensor into one zstd frame (content size and checksum
recorded), `decode` inflates them back; both keep the tensor's shape, run in
`tf.data` maps (also with `num_parallel_calls`) and in `tf.function`s, and
are stateless. `decode_cells` inflates groups of frame cells and splits them
into tensors in one op. A bad blob is a `tf.errors.InvalidArgumentError`
naming its flat index (`blobs[i]`): empty, not one complete frame, damaged
(checksum), without a recorded content size, or larger than `max_size`
decoded. `compress` makes the same frames from Python bytes, calling the
library directly (no TensorFlow dispatch: the write path compresses one
frame a step).

The library `_zstd_ops.so` is loaded on first use (once; `tf.load_op_library`
itself keeps loaded libraries), not on import: a prebuilt one beside this
file if its key matches this TensorFlow and source (Bazel builds it so), else
the per-user cached one, which `build.ensure_built()` compiles the first time
(about a minute, one log line; only a C++ compiler is needed). Where it cannot
be built (no compiler), every call raises `ZstdOpMissingError`, which says
why and what to install; there is no fallback. `available()` asks without
raising, `require()` fails early.
"""

import ctypes
import numbers
import os
from typing import Any, Optional

from absl import logging

from smart_replay import errors
from smart_replay.ops import build

LIBRARY_NAME = build.LIBRARY_NAME
DEFAULT_MAX_SIZE = 64 << 20  # 64 MiB, the op's default.
DEFAULT_LEVEL = 3
_BUILD_HINT = ('It is built on first use, or by `make ops` (`python -m '
               'smart_replay.ops.build`); that needs only a C++ compiler '
               '(apt-get install g++).')

# The loaded op module and its path, once `_load` succeeded.
_module: Optional[Any] = None
_path: Optional[str] = None
# The same library through ctypes (`compress`), once loaded.
_library: Optional[ctypes.CDLL] = None


class ZstdOpMissingError(errors.SmartReplayError, ImportError):
  """The zstd op library is not built (or not loadable); says how to build."""


def prebuilt_path() -> str:
  """Returns where a prebuilt library beside this module would be."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      LIBRARY_NAME)


def library_path() -> str:
  """Returns the library this process loads, building it first if needed.

  A prebuilt library beside this module is used when its key file matches
  `build.library_key()`; otherwise the per-user cached one
  (`build.ensure_built()`).

  Returns:
    The library's path.

  Raises:
    ZstdOpMissingError: it is not prebuilt and cannot be built here; the
      message names the cause.
  """
  prebuilt = prebuilt_path()
  if os.path.exists(prebuilt):
    recorded, key = build.read_key(prebuilt), build.library_key()
    if recorded == key:
      return prebuilt
    logging.log_first_n(
        logging.WARNING, 'Not loading %s: it was built from %s, not %s '
        '(this TensorFlow and source); using the cached build instead.', 1,
        prebuilt, recorded or 'an unknown source (no key file)', key)
  try:
    return build.ensure_built()
  except build.OpBuildError as e:
    raise ZstdOpMissingError(
        f'The zstd TensorFlow op is not built and could not be built here: '
        f'{e} {_BUILD_HINT}') from e


def _load() -> Any:
  """Loads the op library once and returns its module.

  Raises:
    ZstdOpMissingError: the library cannot be built, or TensorFlow refuses
      it.
  """
  global _module, _path
  if _module is not None:
    return _module
  path = library_path()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    module = tf.load_op_library(path)
  except (tf.errors.NotFoundError, OSError) as e:
    # An undefined symbol: built against another TensorFlow.
    raise ZstdOpMissingError(
        f'The zstd TensorFlow op at {path} does not load ({e}); build it '
        f'again for this TensorFlow {tf.__version__}: python -m '
        f'smart_replay.ops.build --force.') from e
  _module, _path = module, path
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


def require() -> Any:
  """Loads the zstd op, or fails with how to build it.

  Returns:
    The loaded library's module (its ops: zstd's and the frame-stack gather
    of `stack_ops.cc`, which `smart_replay.ops.stacks` wraps).

  Raises:
    ZstdOpMissingError: the library is not built or does not load; the
      message says how to build it.
  """
  return _load()


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


def check_level(level: Any) -> None:
  """Raises ValueError naming `level` unless it is an int (zstd checks its
  range when it compresses)."""
  if isinstance(level, bool) or not isinstance(level, numbers.Integral):
    raise ValueError(f'level must be an int, got {level!r}')


def c_library() -> ctypes.CDLL:
  """The op library through ctypes, for its C functions (the write path
  calls them once a step, where an eager op costs about 60 us).

  Returns:
    The library, loaded once (the copy TensorFlow loaded), its functions'
    types declared: `smart_replay_zstd_compress`,
    `smart_replay_zstd_compress_bound`, `smart_replay_split_stacks`
    (`stack_ops.cc`) and `smart_replay_encode_cell` (`cell_encoder.cc`).

  Raises:
    ZstdOpMissingError: the op is not built.
  """
  global _library
  if _library is None:
    _load()
    library = ctypes.CDLL(_path)  # Already loaded: the same copy.
    library.smart_replay_zstd_compress.restype = ctypes.c_int64
    library.smart_replay_zstd_compress.argtypes = [
        ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
        ctypes.c_int]
    library.smart_replay_zstd_compress_bound.restype = ctypes.c_size_t
    library.smart_replay_zstd_compress_bound.argtypes = [ctypes.c_size_t]
    library.smart_replay_split_stacks.restype = None
    library.smart_replay_split_stacks.argtypes = [
        ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_void_p]
    library.smart_replay_encode_cell.restype = ctypes.c_int64
    library.smart_replay_encode_cell.argtypes = [
        ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_size_t]
    _library = library
  return _library


def compress(data: bytes, *, level: int = DEFAULT_LEVEL) -> bytes:
  """Compresses bytes into one zstd frame, as `encode` does, from Python.

  Calls the op library's C function directly: about 1 us of overhead where
  an eager `encode` costs about 60 (the write path compresses a frame per
  step).

  Args:
    data: the bytes.
    level: the zstd level (see `encode`).

  Returns:
    One zstd frame with the content size and a checksum.

  Raises:
    ValueError: `level` is not an int, or outside zstd's range.
    ZstdOpMissingError: the op is not built.
  """
  check_level(level)
  library = c_library()
  data = bytes(data)
  capacity = library.smart_replay_zstd_compress_bound(len(data))
  out = ctypes.create_string_buffer(capacity)
  size = library.smart_replay_zstd_compress(data, len(data), out, capacity,
                                            int(level))
  if size < 0:
    raise ValueError(f'zstd could not compress {len(data)} bytes at level '
                     f'{level!r} (is it within zstd\'s range, -131072..22?).')
  return ctypes.string_at(out, size)  # Only the frame is copied.


def decode_cells(blobs: Any, *, cells: int, row_bytes: int, frame_bytes: int,
                 max_size: int = DEFAULT_MAX_SIZE) -> Any:
  """Inflates groups of frame cells and splits them, in one op.

  Each blob is one zstd frame of a group of `cells` frame cells:
  `uint16 cells | uint8 counts[cells] | rows[cells, row_bytes] | frames`
  (see `smart_replay.layouts.frame_cells`).

  Args:
    blobs: `string[windows, groups]`.
    cells: cells per group.
    row_bytes: bytes of a cell's packed row.
    frame_bytes: bytes of a frame.
    max_size: the largest decoded blob accepted, in bytes.

  Returns:
    `(counts int32[windows, groups * cells], rows uint8[windows, groups *
    cells, row_bytes], frames uint8[total, frame_bytes], offsets
    int32[windows])`: every window's frames one after another, the first of
    window w at `frames[offsets[w]]`.

  Raises:
    ZstdOpMissingError: the op is not built.
    tf.errors.InvalidArgumentError: when run, a blob does not decode (see
      `decode`) or is not such a group; names `blobs[i]`, its flat index.
  """
  module = _load()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return module.smart_replay_zstd_decode_cells(
      tf.convert_to_tensor(blobs, tf.string), cells=int(cells),
      row_bytes=int(row_bytes), frame_bytes=int(frame_bytes),
      max_size=int(max_size))


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
  check_level(level)
  module = _load()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return module.smart_replay_zstd_encode(
      tf.convert_to_tensor(data, tf.string), level=int(level))
