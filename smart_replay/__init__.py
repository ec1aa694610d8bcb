"""smart_replay: a Reverb replay buffer for TF-Agents that just works.

Everything a user constructs or calls is here, at the top level::

    import smart_replay
    manager = smart_replay.ReplayBufferManager(
        agent.collect_data_spec,
        shape=smart_replay.BufferShape(capacity=100_000),
        location=smart_replay.LocalBuffer('buffers/run1'))
    replay_buffer, observer = manager.create_replay_buffer()
    dataset = manager.get_dataset(batch_size=256, num_steps=2)

the option groups (`BufferShape`, `LocalBuffer`, `RemoteBuffer`,
`WriteOptions`, `Timeouts`), `TableConfig`, `FrameStack`, `FractionSchedule`
(a starter mixed into every batch), what a dataset yields (`ReplayInfo`,
`ONLINE`, `STARTER`), TensorBoard summaries (`BufferSummaries`,
`write_buffer_summaries`), paired agent and buffer checkpoints
(`PairedCheckpointer`, `newest_pair`), a standalone server and its metrics
(`ReplayServer`, `MetricsEndpoint`, `save_spec`, `free_port_pair`), moving
buffers in and out (`import_reverb_checkpoint`, `write_rlds`, `import_rlds`,
`export_npz`),
the library calls behind the commands (`populate_starter_buffer`,
`train_from_starter`) and every error. The packages below follow the data
flow, each importing only those below it: `utils`, `spec`, `layouts`,
`config`, `storage`, `server`, `backends`, `writing`, `sampling`, `manager`,
`integrations`, `remote`, `tools`, `apps`; they are the implementation, not
the API. The public names load on first use, so `import smart_replay` does
not load TensorFlow.
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
           'JournalWriteError',
           'ManagerStateError', 'ManifestMismatchError', 'MissingExtraError',
           'PrefillWouldBlockError', 'ServerBusyError',
           'ServerUnavailableError',
           'SmartReplayError', 'StarterMismatchError', 'TrajectorySpecError',
           'UnsafeBufferDirError', 'WaitTimeoutError',
           'WouldBlockError', 'WriteFailedError')
# Public name -> the module that defines it.
_EXPORTS = {
    **{name: 'smart_replay.errors' for name in _ERRORS},
    **{name: 'smart_replay.config.options' for name in (
        'BufferShape', 'LocalBuffer', 'RemoteBuffer', 'Timeouts',
        'WriteOptions')},
    'BufferSummaries': 'smart_replay.integrations.summaries',
    'FractionSchedule': 'smart_replay.sampling.fraction_schedule',
    'FrameStack': 'smart_replay.layouts.frame_cells',
    'MetricsEndpoint': 'smart_replay.remote.metrics',
    'ONLINE': 'smart_replay.sampling.replay_info',
    'PairedCheckpointer': 'smart_replay.integrations.paired',
    'ReplayBufferManager': 'smart_replay.manager.facade',
    'ReplayInfo': 'smart_replay.sampling.replay_info',
    'ReplayServer': 'smart_replay.remote.replay_server',
    'STARTER': 'smart_replay.sampling.replay_info',
    'TableConfig': 'smart_replay.config.tables',
    'TrajectoryObserver': 'smart_replay.writing.observer',
    'export_npz': 'smart_replay.tools.export',
    'free_port_pair': 'smart_replay.utils.ports',
    'import_reverb_checkpoint': 'smart_replay.tools.takeover',
    'import_rlds': 'smart_replay.tools.rlds_io',
    'newest_pair': 'smart_replay.integrations.paired',
    'new_shared_control_credentials': 'smart_replay.control.tokens',
    'populate_starter_buffer': 'smart_replay.apps.populate',
    'save_spec': 'smart_replay.spec.specs',
    'train_from_starter': 'smart_replay.apps.training',
    'write_buffer_summaries': 'smart_replay.integrations.summaries',
    'write_rlds': 'smart_replay.tools.rlds_io',
    'ZstdOpMissingError': 'smart_replay.ops.zstd',
}

# Names of earlier versions, and what replaced them (a clear error, not a
# silent alias).
_REMOVED = {
    'mixing': 'smart_replay.FractionSchedule (the starter mix is '
              'ReplayBufferManager.get_dataset(starter_fraction=...))',
    'telemetry': 'smart_replay.BufferSummaries and '
                 'smart_replay.write_buffer_summaries',
}


def __getattr__(name):
  """Loads a public name on first use (PEP 562)."""
  if name in _REMOVED:
    raise AttributeError(f'smart_replay.{name} was removed; use '
                         f'{_REMOVED[name]}.')
  if name not in _EXPORTS:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS))


__version__ = '0.1.0'

__all__ = sorted(_EXPORTS)
