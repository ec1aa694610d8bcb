"""smart_replay: a Reverb replay buffer for TF-Agents that just works.

The public API::

    from smart_replay import ReplayBufferManager, TableConfig

Everything else (`smart_replay.core.specs`, `.tables`, `.server`, `.observer`,
`.dataset`, `.checkpoints`, `.manifest`) is importable for advanced use.
"""

try:
  import reverb  # pylint: disable=unused-import
except ImportError as e:  # pragma: no cover - depends on the environment
  raise ImportError(
      'smart_replay needs DeepMind Reverb (dm-reverb==0.14.0 with '
      'tensorflow==2.15.1 and tf-agents==0.19.0, CPython 3.9-3.11 on Linux '
      'x86_64). Install the project with `pip install -e .` or run '
      '`make test` to set up .venv.') from e

from smart_replay.errors import BufferInUseError
from smart_replay.errors import CheckpointCorruptError
from smart_replay.errors import CheckpointExistsError
from smart_replay.errors import CheckpointNotFoundError
from smart_replay.errors import ForeignCheckpointError
from smart_replay.errors import CheckpointWriteError
from smart_replay.errors import ManagerStateError
from smart_replay.errors import ManifestMismatchError
from smart_replay.errors import MissingExtraError
from smart_replay.errors import PrefillWouldBlockError
from smart_replay.errors import ServerUnavailableError
from smart_replay.errors import SmartReplayError
from smart_replay.errors import TrajectorySpecError
from smart_replay.errors import WaitTimeoutError
from smart_replay.errors import WouldBlockError
from smart_replay.errors import WriteFailedError
from smart_replay.core.dataset import ReplayInfo
from smart_replay.manager import ReplayBufferManager
from smart_replay.core.observer import TrajectoryObserver
from smart_replay.core.tables import TableConfig

__version__ = '0.1.0'

__all__ = [
    'BufferInUseError',
    'CheckpointCorruptError',
    'CheckpointExistsError',
    'CheckpointNotFoundError',
    'ForeignCheckpointError',
    'CheckpointWriteError',
    'ManagerStateError',
    'ManifestMismatchError',
    'MissingExtraError',
    'PrefillWouldBlockError',
    'ReplayBufferManager',
    'ReplayInfo',
    'ServerUnavailableError',
    'SmartReplayError',
    'TableConfig',
    'TrajectoryObserver',
    'TrajectorySpecError',
    'WaitTimeoutError',
    'WouldBlockError',
    'WriteFailedError',
]
