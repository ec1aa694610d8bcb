"""A starter buffer's provenance file and directory names.

`smart-replay-populate` writes `provenance.json` beside a starter buffer's
checkpoints: the env, policy, seed, gin config, counts, spec, versions and
timings of every session. Readers (`smart-replay-inspect`, the demo, training
from a starter) find it here without importing environments or policies.
Starter buffers live in `<output_dir>/<buffer_name>_seq<L>_<total>steps/`,
named after the requested total when the collection starts; an interrupted
collection keeps that name (a `--resume` finds it there), and its provenance
says what it holds: `complete: false` and `env_steps` of
`requested_env_steps` (`collection_state` says it in words).

The counts (`env_steps`, `episodes`, `items`, ...) are the buffer's, as
`ReplayBufferManager.stats()` reports them, defined once in
`smart_replay.writing.counters`. `LEGACY_KEYS` are older names of some of them,
still written for older readers.
"""

import json
import os
import re
from typing import Any, Dict, List, Optional

from absl import logging

from smart_replay.manager import facade as manager_lib
from smart_replay.spec import specs
from smart_replay.storage import checkpoint_folders as checkpoints_lib
from smart_replay.storage import manifest as manifest_lib

PROVENANCE_NAME = 'provenance.json'
# Older provenance keys, still written (same values): {old name: key}.
LEGACY_KEYS = {'total_steps_requested': 'requested_env_steps',
               'steps_collected': 'env_steps',
               'env_steps_written': 'env_steps',
               'episodes_collected': 'episodes',
               'runs_completed': 'runs'}
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
      `total_steps` (requested env steps), `steps` (env steps collected),
      `episodes` (finished), `runs`.
    interrupted: whether a stop was requested before the total.
    **settings: the populate settings to record as they are.

  Raises:
    OSError: if the file cannot be written.
  """
  stats = manager.stats()
  table = next(iter(stats['tables'].values()))
  seconds = sum(s.get('seconds', 0.0) for s in sessions)
  if stats['env_steps'] != state['steps']:
    logging.warning('The buffer counts %d env steps, its collection %d; '
                    'provenance records the collection\'s.',
                    stats['env_steps'], state['steps'])
  counts = {
      'requested_env_steps': state['total_steps'],
      'env_steps': state['steps'],
      'episodes': state['episodes'],
      'items': table['items'],
      'runs': state['runs'],
  }
  provenance = {
      **settings,
      'env': state['env'],
      'policy': state['policy'],
      'policy_class': state['policy_class'],
      'buffer_dir': manager.checkpoint_dir,
      **counts,
      'complete': state['steps'] >= state['total_steps'],
      'interrupted': interrupted,
      'evicted_items': max(table['inserts'] - table['stored_items'], 0),
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
      **{old: counts[key] for old, key in LEGACY_KEYS.items()},
  }
  manifest_lib.write(path, provenance)  # Atomic JSON write.


def collection_state(record: Dict[str, Any]) -> Optional[str]:
  """Says whether a populated buffer holds what was requested.

  Args:
    record: a provenance dict (older files, with `LEGACY_KEYS` only, too).

  Returns:
    'complete: 1,152 of 1,152 requested env steps', or 'interrupted: 53,778
    of 200,000 requested env steps (...)', or None if `record` does not
    say (not a populated buffer).
  """
  def value(key):
    if key in record:
      return record[key]
    return next((record[old] for old, new in LEGACY_KEYS.items()
                 if new == key and old in record), None)
  done, wanted = value('env_steps'), value('requested_env_steps')
  if done is None or wanted is None:
    return None
  text = f'{done:,} of {wanted:,} requested env steps'
  if record.get('complete', done >= wanted):
    return f'complete: {text}'
  return (f'interrupted: {text} (the directory keeps the requested total in '
          'its name; smart-replay-populate --resume continues it)')


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
