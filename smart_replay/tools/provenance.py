"""A starter buffer's provenance file and directory names.

`smart-replay-populate` writes `provenance.json` beside a starter buffer's
checkpoints: the env, policy, seed, gin config, counts, spec, versions and
timings of every session. Readers (`smart-replay-inspect`, the demo, training
from a starter) find it here without importing environments or policies.
Starter buffers live in `<output_dir>/<buffer_name>_seq<L>_<total>steps/`.
"""

import json
import os
import re
from typing import Any, Dict, List

from absl import logging

from smart_replay import manager as manager_lib
from smart_replay.checkpointing import layout as checkpoints_lib
from smart_replay.checkpointing import manifest as manifest_lib
from smart_replay.core import specs

PROVENANCE_NAME = 'provenance.json'
_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]*$')


def read_provenance(buffer_dir: str) -> Dict[str, Any]:
  """Reads the provenance file of a starter buffer.

  Args:
    buffer_dir: a buffer directory.

  Returns:
    The provenance dict.

  Raises:
    OSError: if the file cannot be read.
    ValueError: if it is not valid JSON.
  """
  with open(os.path.join(buffer_dir, PROVENANCE_NAME)) as f:
    return json.load(f)


def read_sessions(buffer_dir: str) -> List[Dict[str, Any]]:
  """Reads the sessions recorded so far; none if the file is unreadable.

  Args:
    buffer_dir: a buffer directory.

  Returns:
    The `sessions` list of its provenance (a warning is logged, and the list
    is empty, if the file cannot be read).
  """
  try:
    return read_provenance(buffer_dir).get('sessions', [])
  except (OSError, ValueError) as e:
    logging.warning('Could not read the provenance of %s (%s); its session '
                    'history restarts.', buffer_dir, e)
    return []


def write_provenance(path: str, manager: manager_lib.ReplayBufferManager,
                     sessions: List[Dict[str, Any]], *,
                     state: Dict[str, Any], interrupted: bool,
                     **settings: Any) -> None:
  """Writes provenance.json atomically.

  Args:
    path: the file to write.
    manager: the started manager of the buffer (its stats, directory, spec).
    sessions: every session so far, the current one last (with its
      `gin_config`).
    state: the collection state: `env`, `policy`, `policy_class`,
      `total_steps`, `steps`, `episodes`, `runs`.
    interrupted: whether a stop was requested before the total.
    **settings: the populate settings to record as they are.

  Raises:
    OSError: if the file cannot be written.
  """
  stats = manager.stats()
  table = next(iter(stats['tables'].values()))
  seconds = sum(s.get('seconds', 0.0) for s in sessions)
  provenance = {
      **settings,
      'env': state['env'],
      'policy': state['policy'],
      'policy_class': state['policy_class'],
      'buffer_dir': manager.checkpoint_dir,
      'total_steps_requested': state['total_steps'],
      'steps_collected': state['steps'],
      'episodes_collected': state['episodes'],
      'runs_completed': state['runs'],
      'complete': state['steps'] >= state['total_steps'],
      'interrupted': interrupted,
      'items': table['items'],
      'evicted_items': max(table['inserts'] - table['items'], 0),
      'env_steps_written': stats['env_steps'],
      'short_episodes_this_session': stats['short_episodes'],
      'short_episode_steps_this_session': stats['short_episode_steps'],
      'seconds': round(seconds, 3),
      'steps_per_second': round(
          sum(s.get('steps', 0) for s in sessions) / seconds, 1)
                          if seconds else None,
      'sessions': sessions,
      'gin_config': sessions[-1]['gin_config'],
      'data_spec': specs.spec_to_json(manager.data_spec)['leaves'],
      'versions': manifest_lib.package_versions(),
  }
  manifest_lib.write(path, provenance)  # Atomic JSON write.


def validate_buffer_name(name: str) -> str:
  """Checks that `name` is a plain name usable as a directory name.

  Args:
    name: the proposed buffer name.

  Returns:
    `name` unchanged.

  Raises:
    ValueError: if it is empty, contains a path separator or '..', or other
      characters than letters, digits, '.', '_' and '-'.
  """
  if not isinstance(name, str) or not _NAME.match(name) or '..' in name:
    raise ValueError(
        f'buffer_name {name!r} is not a plain name: use letters, digits, '
        "'.', '_' and '-' (starting with a letter or digit), no path "
        "separators and no '..'.")
  return name


def buffer_dir_name(buffer_name: str, sequence_length: int,
                    total_steps: int) -> str:
  """Names a starter buffer's directory after what it holds.

  Args:
    buffer_name: the plain buffer name.
    sequence_length: steps per item.
    total_steps: steps requested in total.

  Returns:
    e.g. 'office_seq2_2880steps'.
  """
  return f'{buffer_name}_seq{sequence_length}_{total_steps}steps'


def find_buffers(output_dir: str, buffer_name: str,
                 sequence_length: int) -> List[str]:
  """Lists buffer directories of this name and sequence length, any total.

  Args:
    output_dir: where buffers are created.
    buffer_name: the plain buffer name.
    sequence_length: steps per item.

  Returns:
    Paths of `<buffer_name>_seq<L>_<N>steps` directories holding checkpoints.
  """
  pattern = re.compile(rf'^{re.escape(buffer_name)}_seq{sequence_length}_'
                       r'\d+steps$')
  if not os.path.isdir(output_dir):
    return []
  return sorted(
      os.path.join(output_dir, name) for name in os.listdir(output_dir)
      if pattern.match(name) and os.path.isdir(
          os.path.join(output_dir, name, checkpoints_lib.CHECKPOINTS_DIR)))
