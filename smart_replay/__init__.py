"""smart_replay: a Reverb replay buffer for TF-Agents that just works.

The public API::

    from smart_replay import ReplayBufferManager, TableConfig

TensorBoard scalars of a buffer, in one line of a TF-Agents Learner::

    import smart_replay
    triggers=[smart_replay.telemetry.BufferSummaries(manager, interval=1000)]

(the `telemetry` subpackage). A read-only starter buffer mixed into each
batch, with a fixed or annealed fraction (the `mixing` subpackage)::

    manager = ReplayBufferManager(..., starter_dir='starter_buffers/office')
    dataset = manager.get_dataset(batch_size=256, train_step=train_step,
        starter_fraction=smart_replay.mixing.FractionSchedule(
            initial=0.5, final=0.1, steps=50_000))

(`smart_replay.mixing` is the `sampling` package, `smart_replay.telemetry`
the `integrations` package.) Everything else is importable for advanced use;
the packages follow the data flow, each importing only those below it:
`utils`, `spec`, `config`, `storage`, `server`, `backends`, `writing`,
`sampling`, `manager`, `integrations`, `remote`, `tools`, `apps`. The public
names load on first use, so `import smart_replay` does not load TensorFlow.
"""

import importlib
import importlib.util

# Checked without importing Reverb (and TensorFlow): `smart_replay.apps.
# native_logs` must be importable before TensorFlow loads, and `import
# smart_replay` stays fast; the public names below load on first use.
if importlib.util.find_spec('reverb') is None:  # pragma: no cover
  raise ImportError(
      'smart_replay needs DeepMind Reverb (dm-reverb==0.14.0 with '
      'tensorflow==2.15.1 and tf-agents==0.19.0, CPython 3.9-3.11 on Linux '
      'x86_64). Install the project with `pip install -e .` or run '
      '`make test` to set up .venv.')

_ERRORS = ('AuthenticationError', 'BufferInUseError', 'CheckpointCorruptError',
           'CheckpointExistsError', 'CheckpointNotFoundError',
           'ForeignCheckpointError', 'CheckpointWriteError',
           'ManagerStateError', 'ManifestMismatchError', 'MissingExtraError',
           'PrefillWouldBlockError', 'ServerBusyError',
           'ServerUnavailableError',
           'SmartReplayError', 'StarterMismatchError', 'TrajectorySpecError',
           'WaitTimeoutError',
           'WouldBlockError', 'WriteFailedError')
# Public name -> the module that defines it.
_EXPORTS = {
    **{name: 'smart_replay.errors' for name in _ERRORS},
    'FractionSchedule': 'smart_replay.sampling.fraction_schedule',
    'FrameStack': 'smart_replay.layouts.frame_cells',
    'ReplayInfo': 'smart_replay.sampling.dataset',
    'ReplayBufferManager': 'smart_replay.manager.facade',
    'TrajectoryObserver': 'smart_replay.writing.observer',
    'TableConfig': 'smart_replay.config.tables',
}


# Public subpackage names -> the packages they are, imported on first use as
# `smart_replay.<name>`.
_SUBPACKAGES = {'mixing': 'smart_replay.sampling',
                'telemetry': 'smart_replay.integrations'}


def __getattr__(name):
  """Loads a public name on first use (PEP 562)."""
  if name in _SUBPACKAGES:
    return importlib.import_module(_SUBPACKAGES[name])
  if name not in _EXPORTS:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS) | set(_SUBPACKAGES))


__version__ = '0.1.0'

__all__ = [
    'BufferInUseError',
    'CheckpointCorruptError',
    'CheckpointExistsError',
    'CheckpointNotFoundError',
    'ForeignCheckpointError',
    'CheckpointWriteError',
    'FractionSchedule',
    'FrameStack',
    'ManagerStateError',
    'ManifestMismatchError',
    'MissingExtraError',
    'PrefillWouldBlockError',
    'ReplayBufferManager',
    'ReplayInfo',
    'ServerUnavailableError',
    'SmartReplayError',
    'StarterMismatchError',
    'TableConfig',
    'TrajectoryObserver',
    'TrajectorySpecError',
    'WaitTimeoutError',
    'WouldBlockError',
    'WriteFailedError',
    'mixing',
    'telemetry',
]
