"""The second half of `make demo`: open a starter buffer and summarize it.

`make demo` first runs `smart-replay-populate` on the embedded thermal
environment, then this, in a fresh process: load the buffer into a throwaway
manager (the starter buffer is only read), sample through `get_dataset`, and
report what is there.
"""

import os
import tempfile
from typing import Any, Dict

import gin
import numpy as np

from smart_replay.manager import facade as manager_lib
from smart_replay.tools import provenance


@gin.configurable
def summarize_buffer(buffer_dir: str, *, batch_size: int = 256
                     ) -> Dict[str, Any]:
  """Loads a buffer without modifying it, samples a batch, and describes it.

  Args:
    buffer_dir: a buffer directory (e.g. one written by the populate command).
    batch_size: size of the sampled batch (the mean reward is over it).

  Returns:
    `buffer_dir`, `checkpoint`, `items`, `env_steps`, `episodes`,
    `batch_shape` (of the observation), `sampled_mean_reward`, and, when the
    buffer has a provenance file, `env`, `policy` and `steps_collected`.

  Raises:
    CheckpointNotFoundError: if `buffer_dir` holds no checkpoint.
  """
  with tempfile.TemporaryDirectory() as scratch:
    manager = manager_lib.ReplayBufferManager.from_checkpoint(
        buffer_dir, checkpoint_dir=scratch, sample_timeout_s=30.0)
    with manager:
      manager.load_replay_buffer(buffer_dir)
      trajectory, _ = next(iter(manager.get_dataset(batch_size=batch_size)))
      stats = manager.stats()
      summary = {
          'buffer_dir': os.path.abspath(buffer_dir),
          'checkpoint': manager.loaded_checkpoint,
          'items': manager.num_frames(),
          'env_steps': stats['env_steps'],
          'episodes': stats['episodes'],
          'batch_shape': tuple(trajectory.observation.shape),
          'sampled_mean_reward': float(np.mean(trajectory.reward.numpy())),
      }
  if os.path.isfile(os.path.join(buffer_dir, provenance.PROVENANCE_NAME)):
    record = provenance.read_provenance(buffer_dir)
    summary.update({key: record.get(key) for key in (
        'env', 'policy', 'policy_class', 'steps_collected')})
  return summary
