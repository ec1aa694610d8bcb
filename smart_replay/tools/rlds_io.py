"""Real RLDS/TFDS datasets in and out, through `rlds` and `tensorflow-datasets`.

`write_rlds(source, output_dir)` writes the episodes of a buffer's newest
checkpoint with `rlds`' `EpisodeWriter`: a TFDS dataset that
`tfds.builder_from_directory(output_dir).as_dataset(split='train')` opens,
each episode a nested `steps` dataset of `observation`, `action`, `reward`,
`discount`, `is_first`, `is_last`, `is_terminal` and the policy's
`policy_info`. `import_rlds(dataset_dir, checkpoint_dir)` turns any RLDS
episode dataset into a starter buffer, converting steps with TF-Agents'
`rlds_to_reverb` (the same step semantics in both directions).

Needs the `rlds` extra (`pip install 'smart_replay[rlds]'`).
"""

import json
import os
from typing import Any, Callable, Dict, Optional

from absl import logging
import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib
import tree

from smart_replay import errors
from smart_replay.config import tables as tables_lib
from smart_replay.manager import facade as manager_lib
from smart_replay.spec import specs
from smart_replay.tools import export
from smart_replay.utils import progress_log

# Beside the TFDS files (never named dataset_info.json: that one is TFDS's):
# what an exact import of our own export needs.
SIDECAR = 'smart_replay_export.json'
SIDECAR_FORMAT = 'smart_replay.rlds/2'


def _libraries():
  """`(tfds, rlds, episode_writer, rlds_base, rlds_to_reverb)`, or an
  install hint."""
  try:
    import rlds  # pylint: disable=g-import-not-at-top
    from rlds.tfds import episode_writer  # pylint: disable=g-import-not-at-top
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    from tensorflow_datasets.rlds import rlds_base  # pylint: disable=g-import-not-at-top
    from tf_agents.replay_buffers import rlds_to_reverb  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise errors.MissingExtraError(
        f'RLDS datasets need the rlds extra ({e.name} is missing): pip '
        "install 'smart_replay[rlds]' (make install does).") from e
  return tfds, rlds, episode_writer, rlds_base, rlds_to_reverb


def _feature(spec: Any, tfds: Any) -> Any:
  """The TFDS feature of a spec nest (dicts of tensors allowed)."""
  if isinstance(spec, dict):
    return tfds.features.FeaturesDict(
        {k: _feature(v, tfds) for k, v in spec.items()})
  return tfds.features.Tensor(shape=tuple(spec.shape),
                              dtype=np.dtype(spec.dtype.as_numpy_dtype))


def _metadata_features(data_spec: Any, tfds: Any) -> Dict[str, Any]:
  """The step fields beyond RLDS's own: `policy_info` and TF-Agents' step
  types."""
  fields = {'step_type': _feature(data_spec.step_type, tfds),
            'next_step_type': _feature(data_spec.next_step_type, tfds)}
  if tree.flatten(data_spec.policy_info):
    fields['policy_info'] = _feature(data_spec.policy_info, tfds)
  return fields


def write_rlds(source: str, output_dir: str, *, table: Optional[str] = None,
               overwrite: bool = False) -> export.ExportResult:
  """Writes a buffer's newest checkpoint as an RLDS dataset (TFDS format).

  Args:
    source: a buffer directory or one `ckpt-N` folder.
    output_dir: the dataset directory to write.
    table: the sequence table whose items define the stored steps; default
      the first one.
    overwrite: replace an existing `output_dir`.

  Returns:
    An `export.ExportResult`.

  Raises:
    MissingExtraError: if rlds / tensorflow-datasets are not installed.
    FileExistsError: if `output_dir` exists and `overwrite` is False.
    ValueError: if the table holds no steps (TFDS cannot read an empty
      split), is unknown or is not a sequence table.
    CheckpointNotFoundError, CheckpointCorruptError: if there is no usable
      checkpoint, or it does not hold what its manifest says.
  """
  tfds, _, episode_writer, rlds_base, _ = _libraries()
  path, manifest, data_spec, table, reader = export._open(source, table)  # pylint: disable=protected-access
  pieces = reader.pieces(table)
  if not pieces:  # TFDS cannot read a split without examples.
    raise ValueError(f'table {table!r} of {path} holds no steps; an RLDS '
                     'dataset needs at least one episode.')
  export._prepare(output_dir, overwrite, is_file=False)  # pylint: disable=protected-access
  policy_info = data_spec.policy_info
  config = rlds_base.DatasetConfig(
      name='smart_replay',
      observation_info=_feature(data_spec.observation, tfds),
      action_info=_feature(data_spec.action, tfds),
      reward_info=_feature(data_spec.reward, tfds),
      discount_info=_feature(data_spec.discount, tfds),
      step_metadata_info=_metadata_features(data_spec, tfds))
  writer = episode_writer.EpisodeWriter(data_directory=output_dir,
                                        ds_config=config)
  episodes = steps = 0
  progress = progress_log.ProgressLog('export', len(pieces), 'episodes')
  for piece in pieces:
    fields = export._steps(data_spec, piece)  # pylint: disable=protected-access
    trajectory = tree.unflatten_as(data_spec, piece.columns)
    rlds_steps = []
    for i in range(piece.num_steps):
      step = {'observation': tree.map_structure(lambda a: a[i],
                                                trajectory.observation),
              'action': tree.map_structure(lambda a: a[i], trajectory.action),
              'reward': trajectory.reward[i],
              'discount': trajectory.discount[i],
              'is_first': bool(fields['is_first'][i]),
              'is_last': bool(fields['is_last'][i]),
              'is_terminal': bool(fields['is_terminal'][i])}
      if tree.flatten(policy_info):
        step['policy_info'] = tree.map_structure(lambda a: a[i],
                                                 trajectory.policy_info)
      # TF-Agents' own step types, so our import rebuilds items exactly.
      step['step_type'] = trajectory.step_type[i]
      step['next_step_type'] = trajectory.next_step_type[i]
      rlds_steps.append(step)
    writer.add_episode({'steps': rlds_steps})
    episodes += 1
    steps += piece.num_steps
    progress.update(episodes)
  progress.close()
  writer.close()
  config = next(t for t in manifest['tables'] if t['name'] == table)
  info = {'format': SIDECAR_FORMAT, 'source_checkpoint': path, 'table': table,
          'data_spec': specs.spec_to_json(data_spec),
          'sequence_length': manifest['sequence_length'],
          'stride_length': manifest['stride_length'],
          'capacity': manifest['capacity'], 'table_config': config,
          'import_problems': export._import_problems(config),  # pylint: disable=protected-access
          'episodes': episodes, 'steps': steps,
          'items': manifest['counts']['tables'][table]['items']}
  with open(os.path.join(output_dir, SIDECAR), 'w') as f:
    json.dump(info, f, indent=1)
  logging.info('Exported %d steps in %d episode pieces of %s to %s.', steps,
               episodes, path, output_dir)
  return export.ExportResult(os.path.abspath(output_dir), path, table,
                             info['items'], episodes, steps)


def _sidecar(dataset_dir: str) -> Optional[Dict[str, Any]]:
  """What `write_rlds` recorded beside the dataset (None for others).

  Raises:
    ValueError: if the exported table's items cannot be rebuilt from its
      steps (names why).
  """
  path = os.path.join(dataset_dir, SIDECAR)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    info = json.load(f)
  if info['import_problems']:
    raise ValueError(
        f"the items of table {info['table']!r} exported to {dataset_dir} "
        'cannot be rebuilt exactly from its steps: '
        + '; '.join(info['import_problems'])
        + '. Read the dataset with tfds.builder_from_directory() instead.')
  return info


def _trajectories(steps: list, with_info: bool) -> list:
  """TF-Agents trajectories of one RLDS episode's steps (numpy)."""
  if steps and 'step_type' in steps[0]:  # Written by write_rlds: exact.
    return [trajectory_lib.Trajectory(
        step_type=step['step_type'], observation=step['observation'],
        action=step['action'],
        policy_info=step['policy_info'] if with_info else (),
        next_step_type=step['next_step_type'], reward=step['reward'],
        discount=step['discount']) for step in steps]
  kinds = [ts.StepType.FIRST if step['is_first'] else
           ts.StepType.LAST if step['is_last'] else ts.StepType.MID
           for step in steps]
  kinds.append(ts.StepType.FIRST)  # The next episode's first step.
  # No value after a terminal state: the last step itself (as TF-Agents'
  # converter does) and the transition into it (TF-Agents reads a window's
  # discount from its first step) get discount 0.
  terminal = [bool(step['is_last']) and bool(step['is_terminal'])
              for step in steps] + [False]
  out = []
  for i, step in enumerate(steps):
    step_type, next_type = kinds[i], kinds[i + 1]
    if step_type == ts.StepType.FIRST and next_type == ts.StepType.FIRST:
      step_type = next_type = ts.StepType.LAST  # A one-step episode.
    discount = np.asarray(step['discount'])
    out.append(trajectory_lib.Trajectory(
        step_type=np.int32(step_type), observation=step['observation'],
        action=step['action'],
        policy_info=step['policy_info'] if with_info else (),
        next_step_type=np.int32(next_type), reward=step['reward'],
        discount=(np.zeros_like(discount) if terminal[i] or terminal[i + 1]
                  else discount)))
  return out


def _count_steps(episodes: tf.data.Dataset, steps_key: str) -> int:
  """The steps of all episodes, counted inside tf.data.

  The nested steps datasets have no known cardinality, so they are read to
  the end. Both functions are traced as written: autograph would convert
  them from their source file, and warns (running them as-is) when that
  file no longer matches the loaded module or is not shipped.

  Args:
    episodes: a dataset of RLDS episodes.
    steps_key: the field of an episode that holds its steps dataset.

  Returns:
    The number of steps.
  """

  @tf.autograph.experimental.do_not_convert
  def steps_of(episode):
    return episode[steps_key]

  @tf.autograph.experimental.do_not_convert
  def add_one(count, step):
    del step  # Counted, not read.
    return count + 1

  return int(episodes.flat_map(steps_of).reduce(np.int64(0), add_one))


def import_rlds(dataset_dir: str, checkpoint_dir: str, *,
                data_spec: Any = None,
                sequence_length: int = 2, capacity: Optional[int] = None,
                overwrite: bool = False,
                stop_requested: Optional[Callable[[], bool]] = None) -> str:
  """Turns any RLDS episode dataset (TFDS format) into a starter buffer.

  Steps become TF-Agents trajectories as `rlds_to_reverb` converts them
  (the spec comes from its
  `create_trajectory_data_spec`), done here per episode because TF-Agents
  0.19's converter mishandles nested (dict) observations; a step field named
  `policy_info` becomes the trajectories' `policy_info`. A terminal last
  step, and the transition into it, get discount 0 whatever the dataset
  recorded there; a last step that is not terminal (a truncation) keeps its
  discount.

  Args:
    dataset_dir: a TFDS dataset directory of RLDS episodes (e.g. written by
      `rlds.tfds.EpisodeWriter` or `write_rlds`); its 'train' split is read.
    checkpoint_dir: the buffer directory to write.
    data_spec: the spec to store the steps under, e.g. the agent's
      `collect_data_spec` (with the action bounds a DQN needs); its
      dtypes and shapes must be the dataset's. None: TF-Agents'
      `create_trajectory_data_spec` of the dataset (no bounds), or our
      export's own spec.
    sequence_length: steps per item of the new buffer.
    capacity: its capacity; default the number of steps.
    overwrite: replace checkpoints already in `checkpoint_dir`.
    stop_requested: polled between episodes; True stops the import
      (KeyboardInterrupt) before any checkpoint is written.

  Returns:
    The checkpoint written.

  Raises:
    MissingExtraError: if rlds / tensorflow-datasets are not installed.
    ValueError: if `dataset_dir` is not an RLDS dataset (names what is
      missing).
    CheckpointExistsError: if `checkpoint_dir` holds checkpoints and
      `overwrite` is False.
  """
  tfds, rlds, _, _, rlds_to_reverb = _libraries()
  try:
    episodes = tfds.builder_from_directory(dataset_dir).as_dataset(
        split='train')
  except Exception as e:  # TFDS raises many types for a bad directory.
    raise ValueError(f'{dataset_dir} is not a TFDS dataset directory with a '
                     f"'train' split: {e}") from e
  step_spec = episodes.element_spec[rlds.STEPS].element_spec
  missing = sorted(set(rlds_to_reverb.get_rlds_step_features()) -
                   set(step_spec))
  if missing:
    raise ValueError(f'{dataset_dir} is not an RLDS episode dataset: its steps '
                     f'lack {missing} (they hold {sorted(step_spec)}).')
  with_info = 'policy_info' in step_spec
  info = _sidecar(dataset_dir)
  total = _count_steps(episodes, rlds.STEPS)
  if info is not None:  # Our export: the exported table, exactly.
    manager = manager_lib.ReplayBufferManager(
        specs.spec_from_json(info['data_spec']), capacity=info['capacity'],
        checkpoint_dir=checkpoint_dir,
        sequence_length=info['sequence_length'],
        stride_length=info['stride_length'],
        table_configs=[tables_lib.TableConfig(**info['table_config'])])
  else:
    derived = rlds_to_reverb.create_trajectory_data_spec(episodes)
    if with_info:
      derived = derived._replace(policy_info=step_spec['policy_info'])
    if data_spec is None:
      data_spec = derived
    else:
      data_spec = specs.as_trajectory(data_spec)
      diffs = specs.diff_specs(derived, data_spec)
      if diffs:
        raise errors.TrajectorySpecError(
            f'{dataset_dir} does not hold steps of data_spec: ' + '; '.join(
                f'{field}: dataset {a}, data_spec {b}'
                for field, a, b in diffs) + '.')
    manager = manager_lib.ReplayBufferManager(
        data_spec, capacity=capacity or max(total, 1),
        checkpoint_dir=checkpoint_dir, sequence_length=sequence_length)
  stop_requested = stop_requested or (lambda: False)
  with manager:
    manager.check_prefill(max(total, 1))
    _, observer = manager.create_replay_buffer(overwrite=overwrite)
    progress = progress_log.ProgressLog('import', total, 'steps')
    index = 0
    for episode in episodes:
      if stop_requested():
        raise KeyboardInterrupt(f'import stopped after {index} steps')
      for trajectory in _trajectories(
          list(episode[rlds.STEPS].as_numpy_iterator()), with_info):
        observer(trajectory)
        index += 1
      observer.end_episode()  # Episodes (and exported pieces) never join.
      progress.update(index)
    progress.close()
    observer.flush()
    if info is not None:
      table = info['table']
      items = manager.stats()['tables'][table]['items']
      if items != info['items']:
        raise errors.CheckpointCorruptError(
            f'importing {dataset_dir} made {items} items in table {table!r}, '
            f"but the export holds {info['items']}.")
    return manager.checkpoint(extra={'imported_from': os.path.abspath(
        dataset_dir), 'imported_steps': total})
