"""The `py_client` of a manager's replay buffer: Reverb's saves go through the manager.

The original buffer manager told its users to save with
`replay_buffer.py_client.checkpoint()`. On a plain Reverb client that call
writes a bare Reverb folder into the server's checkpoint root, which a
smart_replay buffer never loads (it has no manifest, no digests, no number) and
which the next save prunes. `install` replaces the replay buffer's client with
a `ManagedClient` whose `checkpoint()` is `ReplayBufferManager.checkpoint()`:
the documented call keeps its meaning and returns a verified checkpoint.

`ReverbReplayBuffer` keeps its client in a private attribute (TF-Agents 0.19);
`_reverb_internal.set_py_client` sets it.
"""

from typing import Callable

from absl import logging
import reverb
from tf_agents.replay_buffers import reverb_replay_buffer

from smart_replay import _reverb_internal as reverb_internal


class ManagedClient(reverb.Client):
  """A `reverb.Client` whose `checkpoint()` is the manager's.

  Every other method is Reverb's.

  Args:
    server_address: 'host:port' of the Reverb server.
    checkpoint: the manager's `checkpoint` method (returns the path).
  """

  def __init__(self, server_address: str, *, checkpoint: Callable[[], str]):
    super().__init__(server_address)
    self._manager_checkpoint = checkpoint

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
    return self._manager_checkpoint()


def install(replay_buffer: reverb_replay_buffer.ReverbReplayBuffer, *,
            checkpoint: Callable[[], str]) -> ManagedClient:
  """Gives `replay_buffer` a `ManagedClient` as its `py_client`.

  Args:
    replay_buffer: a TF-Agents `ReverbReplayBuffer`.
    checkpoint: the manager's `checkpoint` method.

  Returns:
    The new client (`replay_buffer.py_client`).
  """
  client = ManagedClient(replay_buffer.py_client.server_address,
                         checkpoint=checkpoint)
  reverb_internal.set_py_client(replay_buffer, client)
  return client
