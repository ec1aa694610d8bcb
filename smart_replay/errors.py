"""Exceptions raised by smart_replay.

Every error subclasses `SmartReplayError` and also the builtin exception a
caller would naturally catch (`ValueError`, `FileExistsError`, ...), so code
written against plain Python exceptions keeps working.
"""


class SmartReplayError(Exception):
  """Base class of every error raised by smart_replay."""


class CheckpointExistsError(SmartReplayError, FileExistsError):
  """A new buffer was requested in a directory that already holds checkpoints."""


class CheckpointNotFoundError(SmartReplayError, FileNotFoundError):
  """No complete checkpoint was found where one was expected."""


class ForeignCheckpointError(CheckpointNotFoundError):
  """The checkpoint was written by plain Reverb, not smart_replay: import it
  (`tools.takeover.import_reverb_checkpoint`, `smart-replay-import`)."""


class CheckpointCorruptError(SmartReplayError, IOError):
  """A checkpoint is incomplete, damaged, or does not restore what it claims."""


class CheckpointWriteError(SmartReplayError, OSError):
  """Saving a checkpoint failed (disk full, read-only or failing disk, Reverb).

  Nothing of the failed save is left behind, the earlier checkpoints are
  intact, and the buffer keeps serving: free space (or fix the disk) and call
  `checkpoint()` again. The message names the path and the cause.
  """


class JournalWriteError(SmartReplayError, OSError):
  """The write-ahead journal could not write or sync (disk full, failing disk).

  What could not be written is kept in memory and written again at the next
  call; until then each write raises this error and stores nothing, so no
  step is ever in the buffer without being in its journal. Free space (or fix
  the disk) and write again, or turn the journal off. The message names the
  file and the cause.
  """


class BufferInUseError(SmartReplayError, RuntimeError):
  """Another manager (in this or another process) has the buffer directory open.

  Attributes:
    holder: what the holder recorded: `{'pid', 'host', 'since'}` (may be
      empty if it could not be read).
  """

  def __init__(self, message, holder=None):
    super().__init__(message)
    self.holder = dict(holder or {})


class UnsafeBufferDirError(SmartReplayError, PermissionError):
  """A buffer folder another Unix user could change is refused.

  It (or a folder above it) belongs to another user or is writable by group
  or others, or it, or one of the entries the buffer uses (`orphaned/`,
  `control.token`, ...), is a symbolic link; see
  `smart_replay.storage.ownership`. The message names the path, what is
  wrong and the fix (`chmod go-w ...`, or a folder you own).

  Attributes:
    folder: the refused buffer folder.
  """

  def __init__(self, message, folder=None):
    super().__init__(message)
    self.folder = folder


class ManifestMismatchError(SmartReplayError, ValueError):
  """A checkpoint was written with a configuration other than the requested one.

  Attributes:
    differences: list of `(field, stored_value, requested_value)` tuples.
  """

  def __init__(self, message, differences=()):
    super().__init__(message)
    self.differences = list(differences)


class StarterMismatchError(ManifestMismatchError):
  """A starter buffer is not the one a run's checkpoint recorded (another
  fingerprint), or a checkpoint written without a starter was asked for one."""


class TrajectorySpecError(SmartReplayError, ValueError):
  """A trajectory written to the buffer does not match the buffer's data spec."""


class WaitTimeoutError(SmartReplayError, TimeoutError):
  """A wait on the Reverb server (connect, sample, flush, checkpoint) timed out."""


class ServerUnavailableError(WaitTimeoutError, ConnectionError):
  """A Reverb server (or its control service) could not be reached in time."""


class AuthenticationError(SmartReplayError, PermissionError):
  """A control service refused a call: no token, a wrong one, or a token file
  that cannot be used; the message says where the client looked."""


class ServerBusyError(SmartReplayError, RuntimeError):
  """A control service refused a call because it already runs as many slow
  calls (checkpoints, restores) as it allows; try again later."""


class WriteFailedError(SmartReplayError, RuntimeError):
  """The server failed or refused a write (e.g. it restarted with other tables).

  The steps and items it never confirmed are counted as lost by the observer.
  """


class ManagerStateError(SmartReplayError, RuntimeError):
  """A manager method was called in a state where it cannot work (e.g. closed)."""


class WouldBlockError(SmartReplayError, ValueError):
  """A configuration whose rate limiter would block one side forever."""


class PrefillWouldBlockError(WouldBlockError):
  """Writing a prefill with nothing sampling would block a rate limiter."""


class MissingExtraError(SmartReplayError, ImportError):
  """An optional dependency (an extra such as `smart_replay[plots]`) is not
  installed; the message names the extra to install."""
