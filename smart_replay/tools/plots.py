"""Figures of what a buffer holds (matplotlib, headless).

matplotlib is an optional extra (`pip install smart_replay[plots]`); it is
imported when a figure is drawn.

`plot_buffer(source, path)` reads the newest checkpoint's items once (no
server) and draws: the reward histogram, episode return and length
distributions, the value range of every observation dimension, and, for each
prioritized table, a histogram of item priorities.
"""

import os
from typing import List, Optional

import numpy as np
from tf_agents.trajectories import time_step as ts

from smart_replay import errors
from smart_replay.checkpointing import reader as checkpoint_reader
from smart_replay.checkpointing import layout as checkpoints_lib
from smart_replay.checkpointing import manifest as manifest_lib
from smart_replay.core import specs

_LAST = int(ts.StepType.LAST)


def _pyplot():
  """Imports matplotlib's pyplot with the headless Agg backend.

  Returns:
    The `matplotlib.pyplot` module.

  Raises:
    MissingExtraError: if matplotlib is not installed (an `ImportError`);
      names the extra to install.
  """
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise errors.MissingExtraError(
        'plotting a buffer needs matplotlib, an optional extra: pip install '
        "'smart_replay[plots]'", name='matplotlib') from e
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  return pyplot


def plot_buffer(source: str, output_png: str, *,
                table: Optional[str] = None) -> List[str]:
  """Draws the figures of a buffer's newest checkpoint that verifies.

  Args:
    source: a buffer directory or one `ckpt-N` folder.
    output_png: the PNG file to write (its folder is created).
    table: the sequence table whose items define the steps; default the
      first sequence table.

  Returns:
    The titles of the panels drawn, in order.

  Raises:
    CheckpointNotFoundError, CheckpointCorruptError: if there is no usable
      checkpoint.
    ValueError: if `table` is unknown or the buffer has no sequence table.
      (An empty table gives empty panels.)
    MissingExtraError: if matplotlib (the `plots` extra) is not installed.
  """
  plt = _pyplot()
  path, manifest = checkpoints_lib.newest_verified(source)
  data_spec = specs.spec_from_json(manifest['data_spec'])
  table = manifest_lib.sequence_table(manifest, table)
  reader = checkpoint_reader.CheckpointReader(path)
  leaves = specs.flatten_spec(data_spec)
  index = {leaf.path: i for i, leaf in enumerate(leaves)}
  pieces = reader.pieces(table)
  rewards, returns, lengths = [], [], []
  observations = []
  for piece in pieces:
    step_type = piece.columns[index['step_type']]
    reward = piece.columns[index['reward']].reshape(len(step_type), -1)
    acting = step_type != _LAST  # A boundary step's reward is not earned.
    rewards.append(reward[acting].sum(axis=1))
    if piece.start == 0 and step_type[-1] == _LAST:  # A whole episode.
      returns.append(float(reward[acting].sum()))
      lengths.append(int(acting.sum()))
    observations.append(np.concatenate(
        [piece.columns[i].reshape(piece.num_steps, -1).astype(np.float64)
         for path, i in index.items() if path.split('/')[0] == 'observation'],
        axis=1))
  rewards = np.concatenate(rewards) if rewards else np.zeros(0)
  observations = np.concatenate(observations) if observations else np.zeros(
      (0, 0))
  obs_names = [f'{leaf.path[len("observation/"):] or "observation"}'
               f'[{j}]' for leaf in leaves
               if leaf.path.split('/')[0] == 'observation'
               for j in range(int(np.prod(leaf.shape or (1,))))]
  prioritized = [t['name'] for t in manifest['tables']
                 if t.get('sampler') == 'prioritized']

  titles = [f'Reward per step ({len(rewards):,} steps, table {table!r})',
            f'Episode return ({len(returns)} whole episodes)',
            f'Episode length ({len(lengths)} whole episodes)',
            f'Observation ranges ({observations.shape[1]} dimensions)']
  titles += [f'Priorities of table {name!r}' for name in prioritized]
  columns = 2
  rows = -(-len(titles) // columns)
  figure, axes = plt.subplots(rows, columns, figsize=(12, 4 * rows),
                              squeeze=False)
  axes = axes.ravel()
  axes[0].hist(rewards, bins=50, color='tab:blue')
  axes[0].set_xlabel('reward')
  axes[1].hist(returns, bins=30, color='tab:green')
  axes[1].set_xlabel('return')
  axes[2].hist(lengths, bins=30, color='tab:orange')
  axes[2].set_xlabel('steps')
  if observations.size:
    low, high = observations.min(axis=0), observations.max(axis=0)
    mean = observations.mean(axis=0)
    x = np.arange(len(low))
    axes[3].vlines(x, low, high, color='tab:gray', linewidth=6, alpha=0.5,
                   label='min..max')
    axes[3].plot(x, mean, 'o', color='tab:red', label='mean')
    axes[3].set_xticks(x, obs_names, rotation=90 if len(x) > 8 else 0,
                       fontsize=7)
    axes[3].legend()
  for axis, name in zip(axes[4:], prioritized):
    axis.hist(reader.priorities(name), bins=50, color='tab:purple')
    axis.set_xlabel('priority')
  for axis, title in zip(axes, titles):
    axis.set_title(title)
  for axis in axes[len(titles):]:
    axis.axis('off')
  figure.suptitle(f'{path}', fontsize=9)
  figure.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(output_png)), exist_ok=True)
  figure.savefig(output_png, dpi=80)
  plt.close(figure)
  return titles
