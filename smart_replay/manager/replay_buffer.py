"""The TF-Agents replay buffer a manager hands out, with its guarantees.

Code written for stock TF-Agents saves with
`replay_buffer.py_client.checkpoint()` and samples with
`replay_buffer.as_dataset(...)`. On a plain `ReverbReplayBuffer` the first
writes a bare Reverb folder into the server's checkpoint root, which a
smart_replay buffer never loads (no manifest, no digests, no number) and
which the next save prunes; the second samples without a timeout and yields
Reverb's `SampleInfo` without importance weights.

`ManagedReplayBuffer` keeps both calls and gives them the manager's meaning:
its `py_client` is a `ManagedClient` whose `checkpoint()` is the manager's
(`serving.Serving.checkpoint`), and its `as_dataset` is the manager's
`get_dataset` (`sampling.Sampling`: timeouts that explain themselves, a
`ReplayInfo` with importance weights and padding masks). `install` gives an
existing `ReverbReplayBuffer` the managed client only.

`ReverbReplayBuffer` keeps its client in a private attribute (TF-Agents 0.19);
`_reverb_internal.set_py_client` sets it.
"""

from typing import Any, Callable, Optional, Protocol

from absl import logging
import reverb
import tensorflow as tf
from tf_agents.replay_buffers import reverb_replay_buffer

from smart_replay import _reverb_internal as reverb_internal


class Saves(Protocol):
  """What saves the buffer: the manager's `serving.Serving`."""

  def checkpoint(self, *, extra: Optional[dict] = None) -> str:
    """Writes a verified checkpoint; returns its folder."""


class Samples(Protocol):
  """What samples the buffer: the manager's `sampling.Sampling`."""

  def get_dataset(self, batch_size: int, num_steps: Optional[int] = None
                  ) -> tf.data.Dataset:
    """The manager's dataset of the buffer's first table."""


class ManagedClient(reverb.Client):
  """A `reverb.Client` whose `checkpoint()` is the manager's.

  Every other method is Reverb's.

  Args:
    server_address: 'host:port' of the Reverb server.
    saves: the manager's part that writes checkpoints.
  """

  def __init__(self, server_address: str, *, saves: Saves):
    super().__init__(server_address)
    self._saves = saves

  def checkpoint(self) -> str:
    """Writes a verified checkpoint through `ReplayBufferManager.checkpoint()`.

    Returns:
      The checkpoint folder (`checkpoint_dir/checkpoints/ckpt-N`), which
      `load_replay_buffer()` loads.

    Raises:
      SmartReplayError: whatever `ReplayBufferManager.checkpoint()` raises.
    """
    logging.info('replay_buffer.py_client.checkpoint() saves through '
                 'ReplayBufferManager.checkpoint().')
    return self._saves.checkpoint()


def install(replay_buffer: reverb_replay_buffer.ReverbReplayBuffer, *,
            saves: Saves) -> ManagedClient:
  """Gives `replay_buffer` a `ManagedClient` as its `py_client`.

  Args:
    replay_buffer: a TF-Agents `ReverbReplayBuffer`.
    saves: the manager's part that writes checkpoints.

  Returns:
    The new client (`replay_buffer.py_client`).
  """
  client = ManagedClient(replay_buffer.py_client.server_address, saves=saves)
  reverb_internal.set_py_client(replay_buffer, client)
  return client


class ManagedReplayBuffer(reverb_replay_buffer.ReverbReplayBuffer):
  """A `ReverbReplayBuffer` whose saves and datasets are the manager's.

  Args:
    data_spec: the spec of one step.
    table_name: the table `num_frames()` and `as_dataset` use.
    sequence_length: steps per item, or None for episode items.
    saves: the manager's part that writes checkpoints (what
      `py_client.checkpoint()` calls).
    samples: the manager's part that makes datasets (what `as_dataset`
      returns).
    **server: `local_server=` or `server_address=`, and any other
      `ReverbReplayBuffer` argument.
  """

  def __init__(self, data_spec: Any, table_name: str,
               sequence_length: Optional[int], *, saves: Saves,
               samples: Samples, **server):
    super().__init__(data_spec, table_name, sequence_length, **server)
    self._samples = samples
    install(self, saves=saves)

  def as_dataset(self, sample_batch_size: Optional[int] = None,
                 num_steps: Optional[int] = None,
                 num_parallel_calls: Optional[int] = None,
                 sequence_preprocess_fn: Optional[Callable[[Any], Any]] = None,
                 single_deterministic_pass: bool = False) -> tf.data.Dataset:
    """The manager's dataset of this table (`ReplayBufferManager.get_dataset`).

    Sampling waits at most the manager's `sample_timeout_s`, then the
    iterator raises a `tf.errors.OpError` naming the table and its state
    (and the same iterator samples again on the next call); the info is a
    `ReplayInfo` with the importance-sampling `weight` and padding `mask`.

    Args:
      sample_batch_size: items per batch; None yields single items without
        a batch dimension.
      num_steps: steps per sample, a divisor of the table's sequence length
        (None: the whole item).
      num_parallel_calls: accepted for compatibility; the pipeline's
        parallelism is fixed (see `sampling.dataset`).
      sequence_preprocess_fn: not supported: map the dataset instead.
      single_deterministic_pass: not supported: use
        `ReplayBufferManager.epoch()` to visit every item once.

    Returns:
      A dataset of `(trajectory, ReplayInfo)`, each leaf `[batch, num_steps,
      ...]` (without the batch dimension if `sample_batch_size` is None).

    Raises:
      NotImplementedError: for `single_deterministic_pass=True` or a
        `sequence_preprocess_fn`.
      ValueError: if `sample_batch_size` or `num_steps` is invalid.
    """
    del num_parallel_calls  # The pipeline's parallelism is fixed.
    if single_deterministic_pass:
      raise NotImplementedError(
          'as_dataset(single_deterministic_pass=True): a Reverb table is '
          'sampled, not read in order; visit every item once with '
          'ReplayBufferManager.epoch(batch_size).')
    if sequence_preprocess_fn is not None:
      raise NotImplementedError(
          'as_dataset(sequence_preprocess_fn=...) is not supported; apply it '
          'with dataset.map(lambda trajectory, info: (fn(trajectory), info)).')
    if sample_batch_size is None:
      return self._samples.get_dataset(1, num_steps).map(
          lambda *element: tf.nest.map_structure(lambda t: t[0], element))
    return self._samples.get_dataset(sample_batch_size, num_steps)
