"""A manager's options in four small groups, each checked when it is made.

* `BufferShape`: what the buffer is (capacity, lengths, tables, layout,
  frame stack);
* `LocalBuffer` or `RemoteBuffer`: where it lives (an in-process server on a
  buffer directory, or a client of `smart-replay-serve`); the two are
  separate types, so a local-only option cannot be given to a client;
* `WriteOptions`: how the observers write (environments, chunks, what a
  non-finite or out-of-bounds float does);
* `Timeouts`: how long each kind of wait may take.

`ReplayBufferManager` takes them grouped (`shape=`, `location=`, `writes=`,
`timeouts=`) or as the flat keyword arguments of their fields (gin bindings
such as `ReplayBufferManager.capacity = 1000`); the field names are the flat
names, so a message names the same argument either way.
"""

import dataclasses
import os
from typing import Dict, Optional, Sequence, Tuple, Union

import gin

from smart_replay.config import tables as tables_lib
from smart_replay.layouts import frame_cells
from smart_replay.layouts import packed_steps
from smart_replay.spec import validation as step_validation
from smart_replay.utils import checks

# How a write-ahead journal makes what it holds durable (`WriteOptions.
# journal`, `storage.journal`), like Redis's appendfsync.
JOURNAL_SYNC = ('always', 'every_second', 'off')
# `WriteOptions.journal`'s default: 'every_second', but no journal for a
# buffer of large steps (images, frame stacks: `manager.journals`).
JOURNAL_AUTO = 'auto'


def _positive_or_none(name: str, value: Optional[int]) -> None:
  if value is not None:
    checks.positive(name, value, integer=True)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BufferShape:
  """What the buffer is. None: the default for a new local buffer (2-step
  items, stride 1, one uniform table 'experience', the packed layout when
  every field is numeric), a loaded checkpoint's, or in client mode the
  server's.

  Attributes:
    capacity: the default `max_size` of the tables (required locally).
    sequence_length: steps per item, >= 1.
    stride_length: steps between consecutive item starts, >= 1.
    table_configs: the tables (`TableConfig`s, the first the default).
    layout: 'packed' (all fields in one byte column) or 'columns'.
    frame_stack: a `FrameStack` naming a stacked pixel field (needs the
      packed layout); None (the default) finds one in a new local buffer's
      spec by its shape (`[84, 84, 4]`, `[4, 84, 84]`; see
      `frame_cells.detect_frame_stack`); False stores whole stacks.

  Raises:
    ValueError: naming the first bad field and its value.
  """
  capacity: Optional[int] = None
  sequence_length: Optional[int] = None
  stride_length: Optional[int] = None
  table_configs: Optional[Sequence[tables_lib.TableConfig]] = None
  layout: Optional[str] = None
  frame_stack: Union[frame_cells.FrameStack, None, bool] = None

  def __post_init__(self):
    for name in ('capacity', 'sequence_length', 'stride_length'):
      _positive_or_none(name, getattr(self, name))
    if self.table_configs is not None:
      configs = tuple(self.table_configs)
      for config in configs:
        if not isinstance(config, tables_lib.TableConfig):
          raise ValueError(f'table_configs entries must be TableConfig, got '
                           f'{config!r}.')
      names = [c.name for c in configs]
      if len(set(names)) != len(names):
        raise ValueError(f'table_configs names must be unique, got {names}.')
      object.__setattr__(self, 'table_configs', configs)
    if self.layout is not None and self.layout not in packed_steps.LAYOUTS:
      raise ValueError(f'layout must be one of {packed_steps.LAYOUTS} or None, '
                       f'got {self.layout!r}.')
    stack = self.frame_stack
    if not (stack is None or stack is False or
            isinstance(stack, frame_cells.FrameStack)):
      raise ValueError(f'frame_stack must be a smart_replay.FrameStack(field, '
                       f'axis), None (find one) or False (none), got '
                       f'{self.frame_stack!r}.')
    if self.frame_stack and self.layout == 'columns':
      raise ValueError(f"frame_stack={self.frame_stack!r} needs "
                       f"layout='packed' (or None), got "
                       f'layout={self.layout!r}.')

  @property
  def tables(self) -> Tuple[tables_lib.TableConfig, ...]:
    """The tables to serve locally: the given ones, or one default table."""
    return tuple(self.table_configs or (tables_lib.TableConfig(),))


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LocalBuffer:
  """An in-process Reverb server on a buffer directory.

  Attributes:
    checkpoint_dir: the buffer directory (checkpoints, manifests, lock).
    keep_checkpoints: complete checkpoints kept on disk, >= 1.
    port: the server's port; None picks a free one.
    starter_dir: a starter buffer served read-only beside this one, for
      `get_dataset(starter_fraction=...)`.
    allow_version_mismatch: load checkpoints of other dm-reverb, tensorflow
      or tf-agents versions (with a warning) instead of refusing.

  Raises:
    ValueError: naming the first bad field and its value.
  """
  checkpoint_dir: Union[str, os.PathLike]
  keep_checkpoints: int = 2
  port: Optional[int] = None
  starter_dir: Optional[str] = None
  allow_version_mismatch: bool = False

  def __post_init__(self):
    if (not isinstance(self.checkpoint_dir, (str, os.PathLike)) or
        not str(self.checkpoint_dir)):
      raise ValueError(f'checkpoint_dir must be a non-empty path, got '
                       f'{self.checkpoint_dir!r}.')
    if os.path.exists(self.checkpoint_dir) and not os.path.isdir(
        self.checkpoint_dir):
      raise ValueError(
          f'checkpoint_dir {str(self.checkpoint_dir)!r} is an existing file, '
          'not a directory: give the buffer a directory of its own (it holds '
          'checkpoints/, manifests and a lock).')
    checks.positive('keep_checkpoints', self.keep_checkpoints, integer=True)
    if self.port is not None and (isinstance(self.port, bool) or not
                                  isinstance(self.port, int) or
                                  not 0 < self.port < 65536):
      raise ValueError(f'port must be None or an integer in [1, 65535], got '
                       f'{self.port!r}.')
    object.__setattr__(self, 'allow_version_mismatch',
                       bool(self.allow_version_mismatch))


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RemoteBuffer:
  """A client of a standalone server (`smart-replay-serve`), or of a buffer
  sharded over several.

  Attributes:
    server_address: 'host:port' of its Reverb server; or a list of them, one
      per shard of a sharded buffer (each a `smart-replay-serve` of the same
      spec and tables): writers write to one shard, `get_dataset` samples
      all of them as one table (see `sampling.batcher`).
    control_address: its control service; None: the Reverb port + 1 (of
      each shard).
    actor_id: which shard this client's observers write to, `actor_id %
      len(server_address)` (stable: give each actor its own id); None: a
      shard chosen from the host name and process id.
    restart_check_s: how often the client asks whether the server was
      restarted (besides at every flush and checkpoint, and after a write
      waited), so its writers count what a restart lost even when no write
      waited for it.
    control_token_file: a copy of the server's token file (its
      `<buffer>/control.token`, or `reader.token` for a client that only
      reads; it carries the server's certificate, which the client pins);
      None: `$SMART_REPLAY_CONTROL_TOKEN` (the token alone: then
      `control_tls_ca_file` is needed), else the file
      `$SMART_REPLAY_CONTROL_TOKEN_FILE` names.
    control_tls_ca_file: the CA certificate that signed the control
      service's certificate (given to `smart-replay-serve
      --control_tls_cert_file`); None: the one the token file carries.
    control_tls_cert_file: this client's certificate, for mutual TLS.
    control_tls_key_file: its private key.
    starter_dir: a starter buffer served read-only in this process (not on
      the servers), for this client's `get_dataset(starter_fraction=...)`.
    journal_dir: a folder on this client's machine where its observers keep
      what they sent (instead of memory, `WriteOptions.resend_bytes`),
      synced as `WriteOptions.journal` says ('auto': every second): a
      client started again with the same folder (after its own crash, or
      its machine's) sends what the server lacks of it. One manager uses it
      at a time. None: memory only.

  Raises:
    ValueError: if an address is not 'host:port', `restart_check_s` is not
      a positive number, or a file argument is not a path.
  """
  server_address: Union[str, Sequence[str]]
  control_address: Optional[str] = None
  restart_check_s: float = 10.0
  actor_id: Optional[int] = None
  control_token_file: Optional[str] = None
  control_tls_ca_file: Optional[str] = None
  control_tls_cert_file: Optional[str] = None
  control_tls_key_file: Optional[str] = None
  starter_dir: Optional[str] = None
  journal_dir: Optional[str] = None

  def __post_init__(self):
    addresses = self.server_address
    if not isinstance(addresses, str):
      if (not isinstance(addresses, (list, tuple)) or not addresses or
          len(set(addresses)) != len(addresses)):
        raise ValueError(f"server_address must be 'host:port' or a list of "
                         f'distinct ones (one per shard), got {addresses!r}.')
      object.__setattr__(self, 'server_address', tuple(addresses))
      if len(addresses) > 1 and self.control_address is not None:
        raise ValueError(f'control_address={self.control_address!r} names '
                         'one server; a sharded buffer uses each shard\'s '
                         'Reverb port + 1.')
    named = [('server_address', a) for a in self.addresses] + [
        ('control_address', self.control_address)]
    for name, value in named:
      if value is not None and (not isinstance(value, str) or
                                ':' not in value):
        raise ValueError(f"{name} must be 'host:port', got {value!r}.")
    checks.positive('restart_check_s', self.restart_check_s)
    for name in ('control_token_file', 'control_tls_ca_file',
                 'control_tls_cert_file', 'control_tls_key_file',
                 'starter_dir', 'journal_dir'):
      value = getattr(self, name)
      if value is not None and (not isinstance(value, (str, os.PathLike))
                                or not str(value)):
        raise ValueError(f'{name} must be None or a file path, got '
                         f'{value!r}.')
      if value is not None:
        object.__setattr__(self, name, os.fspath(value))
    if self.actor_id is not None and (isinstance(self.actor_id, bool) or
                                      not isinstance(self.actor_id, int) or
                                      self.actor_id < 0):
      raise ValueError(f'actor_id must be None or an integer >= 0, got '
                       f'{self.actor_id!r}.')

  @property
  def control_files(self) -> Dict[str, Optional[str]]:
    """The credential files, as `ClientCredentials.resolve` takes them."""
    return {'token_file': self.control_token_file,
            'tls_ca_file': self.control_tls_ca_file,
            'tls_cert_file': self.control_tls_cert_file,
            'tls_key_file': self.control_tls_key_file}

  @property
  def addresses(self) -> Tuple[str, ...]:
    """Every shard's address (one for an unsharded buffer)."""
    return ((self.server_address,) if isinstance(self.server_address, str)
            else tuple(self.server_address))


@gin.configurable
@dataclasses.dataclass(frozen=True)
class WriteOptions:
  """How the observers write.

  Attributes:
    num_envs: N if the first observer gets batches of N environments' steps;
      None for unbatched steps.
    chunk_length: steps per Reverb chunk; None: `chunking.auto_chunk_length`.
    non_finite: 'error', 'warn' or 'allow' a NaN/Inf in a float field.
    float_bounds: the same for floats outside their bounded spec; other
      bound violations are always refused.
    journal: how an in-process buffer's write-ahead journal syncs what the
      observers write (`<checkpoint_dir>/journal`, replayed by
      `load_replay_buffer` after a crash, see docs/durability.md):
      'always' (a flush returns once it is on disk), 'every_second' (at
      most the last second is lost) or 'off' (written, never fsynced: a
      process kill loses nothing flushed, a machine crash may); False: no
      journal (only checkpoints survive a crash); 'auto' (the default):
      'every_second', but none for a buffer whose records would take more
      than 4 KiB a step (images; frame stacks with packed items, whose
      records keep whole stacks: said once in the log; ask for it by name
      to have it). Client-mode buffers have none.
    resend_bytes: a client-mode observer of one server keeps up to this
      many bytes of what it sent (the calls, as a journal records them),
      to send again what a restart of the server from an older checkpoint
      lost (`resending.Resender.resend`; packed layouts); what no longer
      fits is counted as lost if a restart needs it.
      0: keep nothing (the loss is counted by time, a lower bound).

  Raises:
    ValueError: naming the first bad field and its value.
  """
  num_envs: Optional[int] = None
  chunk_length: Optional[int] = None
  non_finite: str = 'error'
  float_bounds: str = 'warn'
  journal: Union[str, bool] = JOURNAL_AUTO
  resend_bytes: int = 64 << 20

  def __post_init__(self):
    _positive_or_none('num_envs', self.num_envs)
    if isinstance(self.resend_bytes, bool) or not isinstance(
        self.resend_bytes, int) or self.resend_bytes < 0:
      raise ValueError(f'resend_bytes must be an integer >= 0, got '
                       f'{self.resend_bytes!r}.')
    _positive_or_none('chunk_length', self.chunk_length)
    if self.journal is not False and self.journal not in (
        JOURNAL_SYNC + (JOURNAL_AUTO,)):
      raise ValueError(f'journal must be one of {JOURNAL_SYNC}, '
                       f'{JOURNAL_AUTO!r}, or False for none, got '
                       f'{self.journal!r}.')
    for name in ('non_finite', 'float_bounds'):
      if getattr(self, name) not in step_validation.VALUE_POLICIES:
        raise ValueError(f'{name} must be one of '
                         f'{step_validation.VALUE_POLICIES}, got '
                         f'{getattr(self, name)!r}.')


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Timeouts:
  """How long each kind of wait may take, in seconds (all > 0).

  Attributes:
    sample_timeout_s: sampling waits this long for data before raising.
    write_timeout_s: observer flushes and episode ends.
    connect_timeout_s: the server answering.
    checkpoint_timeout_s: Reverb writing a checkpoint.
    reconnect_timeout_s: observers retrying an unreachable server.

  Raises:
    ValueError: naming the first bad field and its value.
  """
  sample_timeout_s: float = 60.0
  write_timeout_s: float = 60.0
  connect_timeout_s: float = 10.0
  checkpoint_timeout_s: float = 600.0
  reconnect_timeout_s: float = 300.0

  def __post_init__(self):
    for field in dataclasses.fields(self):
      checks.positive(field.name, getattr(self, field.name))
      object.__setattr__(self, field.name, float(getattr(self, field.name)))


Location = Union[LocalBuffer, RemoteBuffer]


def field_names(group: type) -> Tuple[str, ...]:
  """The fields of an option group (the flat argument names it takes)."""
  return tuple(f.name for f in dataclasses.fields(group))
