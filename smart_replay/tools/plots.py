"""Figures of what a buffer holds (matplotlib, headless).

matplotlib is an optional extra (`pip install smart_replay[plots]`); it is
imported when a figure is drawn.

`plot_buffer(source, path)` reads the newest checkpoint's steps once (no
server) and draws, on one page:

- reward per step (histogram) and over the stored steps (with its moving
  mean), episode return per episode in storage order, and episode lengths;
- the action distribution: one bar per value of a discrete action (named
  where the environment is known), a histogram per dimension of a
  continuous one with the spec's bounds marked;
- one panel per observation dimension (up to 16), each on its own scale
  with its name and unit when the environment is known (`plot_labels`), so a
  19 °C temperature does not squash a 0/1 flag;
- for each prioritized table, the histogram of item priorities.

Histograms of a constant draw one labelled bar ("constant = x"), of a few
integer values one bar per value; NaN and infinite values are counted in the
panel's title, not plotted. Boundary steps (TF-Agents' LAST -> FIRST
trajectories) are left out: their reward and action were never taken.
"""

import dataclasses
import os
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
from tf_agents.trajectories import time_step as ts

from smart_replay import errors
from smart_replay.spec import specs
from smart_replay.storage import checkpoint_folders as checkpoints_lib
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import reader as checkpoint_reader
from smart_replay.tools import plot_labels
from smart_replay.tools import provenance as provenance_lib

_LAST = int(ts.StepType.LAST)
MAX_OBSERVATION_PANELS = 16
_COLUMNS = 4


def pyplot():
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


@dataclasses.dataclass
class BufferData:
  """The steps of one table, flattened for plotting (boundaries left out).

  Attributes:
    path: the checkpoint read.
    table: the table whose items define the steps.
    env: the environment named by the buffer's provenance, or None.
    rewards: `[steps]` reward per step (summed over reward dimensions).
    returns, lengths: per whole episode (first and last step stored), in
      storage order.
    actions: `[steps, dims]`, and whether the action is discrete.
    action_bounds: `(minimum, maximum)` per dimension, or None.
    observations: `[steps, dims]`, float64.
    priorities: `{table: [priority of each item]}` of prioritized tables.
  """
  path: str
  table: str
  env: Optional[str]
  rewards: np.ndarray
  returns: np.ndarray
  lengths: np.ndarray
  actions: np.ndarray
  discrete_action: bool
  action_bounds: Optional[Tuple[np.ndarray, np.ndarray]]
  observations: np.ndarray
  priorities: dict


def _field(leaves, columns, piece_steps, prefix):
  parts = [columns[i].reshape(piece_steps, -1)
           for i, leaf in enumerate(leaves)
           if leaf.path.split('/')[0] == prefix]
  return np.concatenate(parts, axis=1) if parts else np.zeros((piece_steps, 0))


def read_buffer(source: str, *, table: Optional[str] = None) -> BufferData:
  """Reads what the figures show from a buffer's newest usable checkpoint.

  Args:
    source: a buffer directory or one `ckpt-N` folder.
    table: the sequence table whose items define the steps; default the
      first sequence table.

  Returns:
    A `BufferData`.

  Raises:
    CheckpointNotFoundError, CheckpointCorruptError: if there is no usable
      checkpoint.
    ValueError: if `table` is unknown or the buffer has no sequence table.
  """
  path, manifest = checkpoints_lib.newest_verified(source)
  data_spec = specs.spec_from_json(manifest['data_spec'])
  table = manifest_lib.sequence_table(manifest, table)
  reader = checkpoint_reader.CheckpointReader(path)
  leaves = specs.flatten_spec(data_spec)
  index = {leaf.path: i for i, leaf in enumerate(leaves)}
  rewards, returns, lengths, actions, observations = [], [], [], [], []
  for piece in reader.pieces(table):
    step_type = piece.columns[index['step_type']]
    acting = step_type != _LAST
    reward = piece.columns[index['reward']].reshape(len(step_type), -1)
    rewards.append(reward[acting].sum(axis=1))
    if piece.start == 0 and step_type[-1] == _LAST:  # A whole episode.
      returns.append(float(reward[acting].sum()))
      lengths.append(int(acting.sum()))
    actions.append(_field(leaves, piece.columns, piece.num_steps,
                          'action')[acting])
    observations.append(_field(leaves, piece.columns, piece.num_steps,
                               'observation')[acting].astype(np.float64))
  action_leaves = [l for l in leaves if l.path.split('/')[0] == 'action']
  bounds = None
  if action_leaves and all(l.minimum is not None for l in action_leaves):
    bounds = tuple(np.concatenate([
        np.broadcast_to(np.asarray(getattr(l, side), np.float64),
                        l.shape or ()).ravel() for l in action_leaves])
                   for side in ('minimum', 'maximum'))
  width = sum(int(np.prod(l.shape or (1,))) for l in action_leaves)
  obs_width = sum(int(np.prod(l.shape or (1,))) for l in leaves
                  if l.path.split('/')[0] == 'observation')
  try:
    env = provenance_lib.read_provenance(
        os.path.dirname(os.path.dirname(path))).get('env')
  except (OSError, ValueError):
    env = None  # Not a populated buffer: generic labels.
  return BufferData(
      path=path, table=table, env=env,
      rewards=np.concatenate(rewards) if rewards else np.zeros(0),
      returns=np.asarray(returns, np.float64),
      lengths=np.asarray(lengths, np.int64),
      actions=(np.concatenate(actions) if actions else
               np.zeros((0, width))).astype(np.float64),
      discrete_action=bool(action_leaves) and all(
          np.issubdtype(np.dtype(l.dtype), np.integer)
          for l in action_leaves),
      action_bounds=bounds,
      observations=(np.concatenate(observations) if observations else
                    np.zeros((0, obs_width))),
      priorities={t['name']: reader.priorities(t['name'])
                  for t in manifest['tables']
                  if t.get('sampler') == 'prioritized'})


def histogram(axis: Any, values: np.ndarray, *, xlabel: str,
              ylabel: str) -> str:
  """Draws a histogram that reads well for any values.

  Args:
    axis: a matplotlib Axes.
    values: the values (NaN and infinities are counted, not drawn).
    xlabel: what the values are (with the unit).
    ylabel: what is counted.

  Returns:
    A note for the panel's title: '' or e.g. ', 3 NaN/inf left out'.
  """
  values = np.asarray(values, np.float64).ravel()
  finite = values[np.isfinite(values)]
  note = (f', {values.size - finite.size} NaN/inf left out'
          if finite.size < values.size else '')
  axis.set_xlabel(xlabel)
  axis.set_ylabel(ylabel)
  if not finite.size:
    axis.text(0.5, 0.5, 'no values', ha='center', va='center',
              transform=axis.transAxes)
    return note
  low, high = finite.min(), finite.max()
  unique = np.unique(finite)
  if high - low <= 1e-12 * max(1.0, abs(high)):
    axis.bar([0], [finite.size], width=0.6, color='tab:blue')
    axis.set_xticks([0], [f'{low:g}'])
    axis.text(0, finite.size / 2, f'constant = {low:g}', ha='center',
              va='center', color='white', fontsize=9)
    return note
  if unique.size <= 12 and np.all(unique == np.round(unique)):
    counts = [(finite == u).sum() for u in unique]
    axis.bar(np.arange(unique.size), counts, color='tab:blue')
    axis.set_xticks(np.arange(unique.size), [f'{u:g}' for u in unique])
    return note
  bins = int(np.clip(np.sqrt(finite.size), 10, 50))
  axis.hist(finite, bins=bins, color='tab:blue')
  return note


def _panels(data: BufferData) -> List[Tuple[str, Callable[[Any], str]]]:
  """(title, draw(axis) -> title note) for every panel, in order."""
  labels = plot_labels.for_env(data.env)
  panels = []

  def reward_histogram(axis):
    return histogram(axis, data.rewards, xlabel='reward per step',
                     ylabel='steps')

  def reward_over_time(axis):
    axis.set_xlabel('stored step (oldest first)')
    axis.set_ylabel('reward')
    if data.rewards.size:
      axis.plot(data.rewards, linewidth=0.4, color='tab:blue', alpha=0.5,
                label='per step')
      window = max(1, min(100, data.rewards.size // 20))
      mean = np.convolve(data.rewards, np.ones(window) / window, 'valid')
      axis.plot(np.arange(mean.size) + window - 1, mean, color='tab:red',
                label=f'moving mean of {window}')
      axis.legend(fontsize=7, loc='best')
    return ''

  def returns_per_episode(axis):
    axis.set_xlabel('episode (storage order)')
    axis.set_ylabel('return')
    if data.returns.size:
      axis.plot(np.arange(data.returns.size), data.returns, 'o-',
                markersize=3, linewidth=0.8, color='tab:green')
      axis.xaxis.get_major_locator().set_params(integer=True)
    else:
      axis.text(0.5, 0.5, 'no whole episode stored', ha='center',
                va='center', transform=axis.transAxes)
    return ''

  def episode_lengths(axis):
    return histogram(axis, data.lengths, xlabel='episode length (steps)',
                     ylabel='episodes')

  panels += [
      (f'Reward per step ({data.rewards.size:,} steps)', reward_histogram),
      ('Reward over the stored steps', reward_over_time),
      (f'Episode return ({data.returns.size} whole episodes)',
       returns_per_episode),
      (f'Episode length ({data.lengths.size} whole episodes)',
       episode_lengths)]
  panels += _action_panels(data, labels)
  dims = data.observations.shape[1]
  shown = min(dims, MAX_OBSERVATION_PANELS)
  for d in range(shown):
    name = plot_labels.axis_label(labels and labels.observation, d,
                                  f'observation[{d}]')
    title = f'Observation: {name.split(" (")[0]}'
    if d == shown - 1 and dims > shown:
      title += f' ({dims - shown} more dimensions not shown)'
    panels.append((title, lambda axis, d=d, name=name: histogram(
        axis, data.observations[:, d], xlabel=name, ylabel='steps')))
  for table, values in data.priorities.items():
    panels.append((f'Priorities of table {table!r} ({len(values):,} items)',
                   lambda axis, v=values: histogram(
                       axis, np.asarray(v), xlabel='priority',
                       ylabel='items')))
  return panels


def _action_panels(data: BufferData, labels) -> List[Tuple[str, Callable]]:
  panels = []
  if data.discrete_action and data.actions.shape[1] == 1:
    values = data.actions[:, 0].astype(np.int64)
    if data.action_bounds is not None:
      low, high = int(data.action_bounds[0][0]), int(data.action_bounds[1][0])
      shown = list(range(low, high + 1)) if high - low < 50 else sorted(
          set(values.tolist()))
    else:
      shown = sorted(set(values.tolist()))

    def bars(axis):
      counts = [(values == v).sum() for v in shown]
      axis.bar(np.arange(len(shown)), counts, color='tab:purple')
      axis.set_xticks(np.arange(len(shown)),
                      plot_labels.value_names(labels, shown),
                      rotation=0 if len(shown) <= 6 else 90)
      axis.set_xlabel(plot_labels.axis_label(labels and labels.action, 0,
                                             'action'))
      axis.set_ylabel('steps')
      total = max(values.size, 1)
      axis.set_ylim(0, max(max(counts, default=0), 1) * 1.15)
      for x, count in enumerate(counts):
        axis.text(x, count, f'{100 * count / total:.0f}%', ha='center',
                  va='bottom', fontsize=8)
      return ''
    return [(f'Actions ({values.size:,} steps)', bars)]
  for d in range(min(data.actions.shape[1], 4)):
    name = plot_labels.axis_label(labels and labels.action, d,
                                  f'action[{d}]')

    def continuous(axis, d=d, name=name):
      note = histogram(axis, data.actions[:, d], xlabel=name,
                       ylabel='steps')
      if data.action_bounds is not None and len(np.unique(
          data.actions[:, d][np.isfinite(data.actions[:, d])])) > 12:
        for i, bound in enumerate((data.action_bounds[0][d],
                                   data.action_bounds[1][d])):
          axis.axvline(bound, color='black', linestyle='--', linewidth=1,
                       label=None if i else 'spec bounds')
        axis.legend(fontsize=7, loc='upper left')
      return note
    panels.append((f'Action: {name.split(" (")[0]}', continuous))
  return panels


def make_figure(data: BufferData) -> Tuple[Any, List[str]]:
  """Draws every panel of `data` on one figure.

  Args:
    data: what `read_buffer` returned.

  Returns:
    `(figure, titles)`: the matplotlib Figure (close it when done) and the
    panel titles, in order.

  Raises:
    MissingExtraError: if matplotlib (the `plots` extra) is not installed.
  """
  plt = pyplot()
  panels = _panels(data)
  rows = -(-len(panels) // _COLUMNS)
  figure, axes = plt.subplots(rows, _COLUMNS, figsize=(4.2 * _COLUMNS,
                                                       3.3 * rows),
                              squeeze=False, layout='constrained')
  axes = axes.ravel()
  titles = []
  for axis, (title, draw) in zip(axes, panels):
    title += draw(axis)
    axis.set_title(title, fontsize=9)
    axis.tick_params(labelsize=8)
    titles.append(title)
  for axis in axes[len(panels):]:
    axis.axis('off')
  where = f'table {data.table!r} of {data.path}'
  figure.suptitle(f'{data.env or "buffer"}: {where}', fontsize=10)
  return figure, titles


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
  plt = pyplot()
  figure, titles = make_figure(read_buffer(source, table=table))
  os.makedirs(os.path.dirname(os.path.abspath(output_png)), exist_ok=True)
  figure.savefig(output_png, dpi=90)
  plt.close(figure)
  return titles
