"""Taking a buffer elsewhere: the steps a checkpoint holds, and `.npz`.

`export_npz` writes flat transitions. The RLDS dataset of a buffer (a real
TFDS dataset, through `rlds`) is `rlds_io.write_rlds`, which reads the
checkpoint with the helpers here: `_open` verifies the newest checkpoint and
checks its item count against the manifest, `_steps` gives each run of
stored steps its RLDS step fields (`is_first`, `is_last`, `is_terminal`).

A piece that does not start at its episode's first step has `is_first` false
everywhere, one that does not reach the episode's end has no `is_last` step,
and `is_terminal` needs the step before the last one (discount 0): if that
step is not stored, `is_terminal` is false.

Reading never samples: it uses `checkpoint_reader`, which reads every item
exactly once, in insertion order, and the item count must equal the
manifest's.
"""

import os
import shutil
from typing import Any, Dict, List, NamedTuple, Optional

import numpy as np
from tf_agents.trajectories import time_step as ts

from smart_replay import errors
from smart_replay.spec import specs
from smart_replay.storage import checkpoint_folders as checkpoints_lib
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import reader as checkpoint_reader

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
