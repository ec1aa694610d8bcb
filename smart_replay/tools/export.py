"""Taking a buffer elsewhere: RLDS-style TFRecords and `.npz`, and back.

`export_rlds` writes the steps a checkpoint holds as episodes, one
`tf.train.SequenceExample` per run of consecutive steps of one episode, in
`episodes.tfrecord`, with RLDS's step fields (`observation/...`, `action`,
`reward`, `discount`, `is_first`, `is_last`, `is_terminal`) and the rest of
the TF-Agents trajectory under `extras/` (`step_type`, `next_step_type`,
`policy_info/...`), each step's value a serialized tensor. `dataset_info.json`
lists the fields with dtype and shape, so `read_rlds` (plain `tf.data`, no
smart_replay needed; see its code) parses it back; `spec.pbtxt` is the data
spec. `import_rlds` writes such a data set into a new starter buffer with the
exported table: buffer -> RLDS -> buffer gives identical items (a table whose
items leave gaps inside an episode, through a non-FIFO remover or
`max_times_sampled`, or that crosses episodes, is refused). `export_npz`
writes flat transitions.

A piece that does not start at its episode's first step has `is_first` false
everywhere, one that does not reach the episode's end has no `is_last` step,
and `is_terminal` needs the step before the last one (discount 0): if that
step is not stored, `is_terminal` is false.

Reading never samples: it uses `checkpoint_reader`, which reads every item
exactly once, in insertion order, and the item count must equal the
manifest's.
"""

import json
import os
import shutil
from typing import Any, Dict, List, NamedTuple, Optional

from absl import logging
import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts
import tree

from smart_replay.checkpointing import reader as checkpoint_reader
from smart_replay.checkpointing import layout as checkpoints_lib
from smart_replay import errors
from smart_replay import manager as manager_lib
from smart_replay.checkpointing import manifest as manifest_lib
from smart_replay.core import specs
from smart_replay.core import tables as tables_lib

EPISODES_FILE = 'episodes.tfrecord'
INFO_FILE = 'dataset_info.json'
SPEC_FILE = 'spec.pbtxt'
FORMAT = 'smart_replay.rlds/1'
_LAST = int(ts.StepType.LAST)
_FIRST = int(ts.StepType.FIRST)


class ExportResult(NamedTuple):
  """What an export wrote.

  Attributes:
    path: the data set folder or `.npz` file.
    checkpoint: the checkpoint read.
    table: the table whose items defined the steps.
    items: items read (equal to the manifest's count).
    episodes: episode pieces (runs of stored steps of one episode) read.
    steps: steps written (RLDS) or transitions (npz).
  """
  path: str
  checkpoint: str
  table: str
  items: int
  episodes: int
  steps: int


def _rlds_name(path: str) -> str:
  """The RLDS field name of a trajectory field path."""
  head, _, rest = path.partition('/')
  if head in ('observation', 'action', 'reward', 'discount'):
    return path
  return f'extras/{path}' if not rest else f'extras/{head}/{rest}'


def _open(source: str, table: Optional[str]):
  """Verifies the newest checkpoint at `source`; counts its items."""
  path, manifest = checkpoints_lib.newest_verified(source)
  data_spec = specs.spec_from_json(manifest['data_spec'])
  table = manifest_lib.sequence_table(manifest, table)
  reader = checkpoint_reader.CheckpointReader(path)
  want = manifest['counts']['tables'][table]['items']
  if reader.tables()[table] != want:
    raise errors.CheckpointCorruptError(
        f'read {reader.tables()[table]} items of table {table!r} from {path}, '
        f'but its manifest records {want}.')
  return path, manifest, data_spec, table, reader


def _fields(data_spec: Any) -> Dict[str, Dict[str, Any]]:
  """`{rlds name: {'dtype', 'shape'}}` of every step field."""
  fields = {_rlds_name(leaf.path): {'dtype': leaf.dtype,
                                    'shape': list(leaf.shape)}
            for leaf in specs.flatten_spec(data_spec)}
  for flag in ('is_first', 'is_last', 'is_terminal'):
    fields[flag] = {'dtype': 'bool', 'shape': []}
  return fields


def _import_problems(config: Dict[str, Any]) -> List[str]:
  """Why items of a table could not be rebuilt exactly from its steps."""
  problems = []
  if config.get('remover') != 'fifo':
    problems.append(f"remover {config.get('remover')!r} (not 'fifo') evicts "
                    'items inside an episode')
  if config.get('max_times_sampled'):
    problems.append(f"max_times_sampled={config['max_times_sampled']} "
                    'deletes sampled items inside an episode')
  if config.get('cross_episodes'):
    problems.append('cross_episodes items join episodes')
  return problems


def _steps(data_spec: Any, piece: checkpoint_reader.Piece) -> Dict[str, Any]:
  """RLDS step fields of `piece`: `{name: array [steps, ...]}`."""
  leaves = specs.flatten_spec(data_spec)
  by_path = {leaf.path: column for leaf, column in zip(leaves, piece.columns)}
  fields = {_rlds_name(leaf.path): by_path[leaf.path] for leaf in leaves}
  step_type = by_path['step_type']
  discount = by_path['discount']
  is_last = step_type == _LAST
  # A LAST step ends in a terminal state if the step before gave discount 0.
  before = np.concatenate([[1.0], discount[:-1]]).astype(discount.dtype)
  fields['is_first'] = step_type == _FIRST
  fields['is_last'] = is_last
  fields['is_terminal'] = is_last & (before == 0)
  return fields


def export_rlds(source: str, output_dir: str, *, table: Optional[str] = None,
                overwrite: bool = False) -> ExportResult:
  """Writes the steps of a buffer's newest checkpoint as an RLDS data set.

  Args:
    source: a buffer directory or one `ckpt-N` folder.
    output_dir: the data set folder to write.
    table: the sequence table whose items define the steps; default the
      first sequence table.
    overwrite: replace an existing `output_dir`.

  Returns:
    An `ExportResult`.

  Raises:
    CheckpointNotFoundError, CheckpointCorruptError: if there is no usable
      checkpoint, or it does not hold what its manifest says.
    FileExistsError: if `output_dir` exists and `overwrite` is False.
    ValueError: if `table` is unknown or not a sequence table.
  """
  path, manifest, data_spec, table, reader = _open(source, table)
  _prepare(output_dir, overwrite)
  pieces = reader.pieces(table)
  steps = 0
  with tf.io.TFRecordWriter(os.path.join(output_dir, EPISODES_FILE)) as out:
    for piece in pieces:
      example = tf.train.SequenceExample()
      example.context.feature['episode_id'].int64_list.value.append(
          int(np.uint64(piece.episode_id).astype(np.int64)))
      example.context.feature['start'].int64_list.value.append(piece.start)
      for name, values in _steps(data_spec, piece).items():
        feature_list = example.feature_lists.feature_list[name]
        for value in values:  # As tf.io.serialize_tensor, 4x faster.
          feature_list.feature.add().bytes_list.value.append(
              tf.make_tensor_proto(value).SerializeToString())
      out.write(example.SerializeToString())
      steps += piece.num_steps
  specs.save_spec(os.path.join(output_dir, SPEC_FILE), data_spec)
  config = next(t for t in manifest['tables'] if t['name'] == table)
  info = {'format': FORMAT, 'source_checkpoint': path, 'table': table,
          'sequence_length': manifest['sequence_length'],
          'stride_length': manifest['stride_length'],
          'capacity': manifest['capacity'], 'table_config': config,
          'import_problems': _import_problems(config),
          'episodes': len(pieces), 'steps': steps,
          'items': manifest['counts']['tables'][table]['items'],
          'fields': _fields(data_spec)}
  with open(os.path.join(output_dir, INFO_FILE), 'w') as f:
    json.dump(info, f, indent=1)
  logging.info('Exported %d steps in %d episode pieces of %s to %s.', steps,
               len(pieces), path, output_dir)
  return ExportResult(output_dir, path, table, info['items'], len(pieces),
                      steps)


def _prepare(output: str, overwrite: bool, *, is_file: bool = False) -> None:
  if os.path.exists(output):
    if not overwrite:
      raise FileExistsError(f'{output} already exists; pass overwrite=True '
                            'to replace it.')
    if os.path.isdir(output) and not is_file:
      shutil.rmtree(output)
    else:
      os.remove(output)
  if not is_file:
    os.makedirs(output)
  else:
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)


def read_rlds(path: str) -> tf.data.Dataset:
  """Reads an exported RLDS data set with plain `tf.data`.

  Args:
    path: the data set folder.

  Returns:
    A dataset of episodes: `{'episode_id', 'start', 'steps': {name:
    tensor [steps, ...]}}`.

  Raises:
    FileNotFoundError: if `path` has no `dataset_info.json`.
  """
  with open(os.path.join(path, INFO_FILE)) as f:
    fields = json.load(f)['fields']
  features = {name: tf.io.FixedLenSequenceFeature([], tf.string)
              for name in fields}
  context = {'episode_id': tf.io.FixedLenFeature([], tf.int64),
             'start': tf.io.FixedLenFeature([], tf.int64)}

  def parse(record):
    head, steps = tf.io.parse_single_sequence_example(
        record, context_features=context, sequence_features=features)
    decoded = {}
    for name, field in fields.items():
      dtype = tf.as_dtype(field['dtype'])
      decoded[name] = tf.ensure_shape(
          tf.map_fn(lambda v, d=dtype: tf.io.parse_tensor(v, d), steps[name],
                    fn_output_signature=dtype),
          [None] + field['shape'])
    return dict(head, steps=decoded)

  return tf.data.TFRecordDataset(os.path.join(path, EPISODES_FILE)).map(parse)


def _trajectories(data_spec: Any, steps: Dict[str, np.ndarray]) -> List[Any]:
  """The TF-Agents trajectories of one exported episode piece."""
  leaves = specs.flatten_spec(data_spec)
  columns = [steps[_rlds_name(leaf.path)] for leaf in leaves]
  count = len(columns[0])
  return [tree.unflatten_as(data_spec, [c[i] for c in columns])
          for i in range(count)]


def import_rlds(path: str, checkpoint_dir: str, *,
                overwrite: bool = False) -> str:
  """Writes an exported RLDS data set into a new starter buffer.

  The buffer gets the exported table (its config, the spec, capacity and
  lengths); each episode piece is written as one episode, so it holds the
  same items (in the same order when one environment wrote them; steps of
  several environments interleaved in time come back episode by episode).

  Args:
    path: the data set folder (`export_rlds` output).
    checkpoint_dir: the new buffer directory.
    overwrite: replace a buffer already there.

  Returns:
    The checkpoint written.

  Raises:
    FileNotFoundError: if `path` is not an exported data set.
    CheckpointExistsError: if `checkpoint_dir` holds a buffer and
      `overwrite` is False.
    CheckpointCorruptError: if the new buffer does not hold the exported
      item count.
    ValueError: if the exported table's items cannot be rebuilt from its
      steps (see the module docstring); names why.
    PrefillWouldBlockError: if the table's rate limiter would block the
      import.
  """
  info_path = os.path.join(path, INFO_FILE)
  if not os.path.isfile(info_path):
    raise FileNotFoundError(f'{path} is not an exported data set (no '
                            f'{INFO_FILE}).')
  with open(info_path) as f:
    info = json.load(f)
  if info['import_problems']:
    raise ValueError(
        f'the items of table {info["table"]!r} exported to {path} cannot be '
        'rebuilt exactly from its steps: ' + '; '.join(info['import_problems'])
        + '. Read the data set with read_rlds() instead.')
  data_spec = specs.load_spec(os.path.join(path, SPEC_FILE))
  manager = manager_lib.ReplayBufferManager(
      data_spec=data_spec, capacity=info['capacity'],
      checkpoint_dir=checkpoint_dir, sequence_length=info['sequence_length'],
      stride_length=info['stride_length'],
      table_configs=[tables_lib.TableConfig(**info['table_config'])])
  with manager:
    manager.check_prefill(max(info['steps'], 1))
    _, observer = manager.create_replay_buffer(overwrite=overwrite)
    for episode in read_rlds(path).as_numpy_iterator():
      for trajectory in _trajectories(data_spec, episode['steps']):
        observer(trajectory)
      observer.end_episode()  # Pieces never join.
    observer.flush()
    items = manager.stats()['tables'][info['table']]['items']
    if items != info['items']:
      raise errors.CheckpointCorruptError(
          f'importing {path} made {items} items in table {info["table"]!r}, '
          f'but the export holds {info["items"]}.')
    checkpoint = manager.checkpoint(extra={'imported_from': os.path.abspath(
        path)})
  return checkpoint


def export_npz(source: str, output_file: str, *, table: Optional[str] = None,
               overwrite: bool = False) -> ExportResult:
  """Writes the transitions a buffer's newest checkpoint holds to `.npz`.

  A transition is a stored step and the next stored step of the same
  episode (boundary steps, whose next step starts another episode, give
  none). The file holds one array per trajectory field (`observation/...`,
  `action`, `reward`, `discount`, `step_type`, `next_step_type`,
  `policy_info/...`), `next_observation/...`, and `episode_id`; all with the
  transitions on axis 0.

  Args:
    source: a buffer directory or one `ckpt-N` folder.
    output_file: the `.npz` file to write.
    table: the sequence table whose items define the steps; default the
      first sequence table.
    overwrite: replace an existing file.

  Returns:
    An `ExportResult` (`steps` counts transitions).

  Raises:
    CheckpointNotFoundError, CheckpointCorruptError, FileExistsError,
    ValueError: as `export_rlds`.
  """
  path, _, data_spec, table, reader = _open(source, table)
  _prepare(output_file, overwrite, is_file=True)
  leaves = specs.flatten_spec(data_spec)
  step_type_index = [leaf.path for leaf in leaves].index('step_type')
  obs_paths = [(i, leaf.path) for i, leaf in enumerate(leaves)
               if leaf.path.split('/')[0] == 'observation']
  parts = {leaf.path: [] for leaf in leaves}
  parts.update({f'next_{p}': [] for _, p in obs_paths})
  parts['episode_id'] = []
  pieces = reader.pieces(table)
  for piece in pieces:
    keep = piece.columns[step_type_index][:-1] != _LAST
    for leaf, column in zip(leaves, piece.columns):
      parts[leaf.path].append(column[:-1][keep])
    for i, p in obs_paths:
      parts[f'next_{p}'].append(piece.columns[i][1:][keep])
    parts['episode_id'].append(np.full(int(keep.sum()), piece.episode_id,
                                       np.uint64))
  shapes = {leaf.path: (np.dtype(leaf.dtype), leaf.shape) for leaf in leaves}
  shapes.update({f'next_{p}': shapes[p] for _, p in obs_paths})
  shapes['episode_id'] = (np.dtype(np.uint64), ())
  arrays = {name: np.concatenate(values) if values else
            np.zeros((0,) + tuple(shapes[name][1]), shapes[name][0])
            for name, values in parts.items()}
  with open(output_file, 'wb') as f:
    np.savez(f, **arrays)
  count = len(arrays['episode_id'])
  return ExportResult(output_file, path, table, reader.tables()[table],
                      len(pieces), count)
