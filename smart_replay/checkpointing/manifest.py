"""The manifest stored beside each checkpoint.

Reverb restores a checkpoint's own table config (sampler, remover, max_size,
rate limiter, signature) over whatever the new server asks for, without a word.
The manifest records what the buffer was built with, so a load can compare it
with what is requested *before* a server starts and list every difference.
"""

import datetime
import importlib.metadata
import json
import os
import platform
from typing import Any, Dict, List, Optional, Tuple

from smart_replay.core import packing
from smart_replay.core import specs
from smart_replay.core import tables as tables_lib

MANIFEST_NAME = 'manifest.json'
FORMAT = 'smart_replay.checkpointing.manifest/1'
# Fields that must match between a checkpoint and the manager that loads it.
CONFIG_FIELDS = ('sequence_length', 'stride_length', 'capacity')
# Installed packages that must match the ones a checkpoint was written with:
# they define the checkpoint format and how the spec is decoded.
VERSION_FIELDS = ('dm-reverb', 'tensorflow', 'tf-agents')
_PACKAGES = ('smart_replay', 'dm-reverb', 'tensorflow', 'tf-agents',
             'tensorflow-probability', 'numpy')


def package_versions() -> dict:
  """Returns the installed versions of the packages a buffer depends on."""
  versions = {'python': platform.python_version()}
  for name in _PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  return versions


def build_config(*, data_spec: Any, sequence_length: int, stride_length: int,
                 capacity: int,
                 table_configs: List[tables_lib.TableConfig],
                 layout: Optional[dict] = None) -> dict:
  """Describes a buffer's configuration as a manifest would store it.

  Args:
    data_spec: the buffer's data spec.
    sequence_length: steps per item.
    stride_length: steps between the starts of consecutive items.
    capacity: the manager's capacity (default table size).
    table_configs: the resolved table configs.
    layout: `packing.Layout.describe()` of the storage layout; None for
      one column per field (`{'name': 'columns'}`).

  Returns:
    A JSON-serializable dict with `data_spec`, `sequence_length`,
    `stride_length`, `capacity`, `tables` and `layout`.
  """
  return {
      'data_spec': specs.spec_to_json(data_spec),
      'sequence_length': sequence_length,
      'stride_length': stride_length,
      'capacity': capacity,
      'tables': [t.to_dict() for t in table_configs],
      'layout': layout or {'name': 'columns'},
  }


def build_manifest(config: dict, *, counts: dict, files: dict,
                   checkpoint_name: str, extra: Optional[dict] = None) -> dict:
  """Assembles a full manifest for one checkpoint.

  Args:
    config: what `build_config` returned.
    counts: `{'tables': {name: {...}}, 'env_steps': n, 'episodes': n}`.
    files: what `checkpoint_files.file_digests` returned.
    checkpoint_name: the checkpoint folder's name.
    extra: optional user metadata (e.g. `{'train_step': 1000}`).

  Returns:
    The manifest dict.
  """
  return {
      'format': FORMAT,
      'checkpoint': checkpoint_name,
      'created_utc': datetime.datetime.now(datetime.timezone.utc).isoformat(),
      **config,
      'counts': counts,
      'files': files,
      'extra': dict(extra or {}),
      'versions': package_versions(),
  }


def write(path: str, manifest: dict) -> None:
  """Writes `manifest` to `path` atomically (temp file, fsync, rename).

  Args:
    path: destination file path.
    manifest: the manifest dict.
  """
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(manifest, f, indent=2, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read(path: str) -> dict:
  """Reads a manifest file.

  Args:
    path: the manifest file.

  Returns:
    The manifest dict.

  Raises:
    FileNotFoundError: if the file does not exist.
    ValueError: if it is not a smart_replay manifest (message names the path).
  """
  with open(path) as f:
    try:
      manifest = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f'{path} is not valid JSON: {e}') from e
  if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
    found = manifest.get('format') if isinstance(manifest, dict) else None
    raise ValueError(f'{path} is not a smart_replay manifest (format '
                     f'{found!r}, expected {FORMAT!r}).')
  return manifest


def diff_config(stored: dict, requested: dict) -> List[Tuple[str, Any, Any]]:
  """Lists every field where a stored config differs from a requested one.

  Args:
    stored: a manifest (or `build_config` result) from disk.
    requested: what `build_config` returns for the loading manager.

  Returns:
    `(field, stored_value, requested_value)` tuples; empty when they match.
  """
  diffs = specs.diff_spec_leaves(stored['data_spec']['leaves'],
                                 requested['data_spec']['leaves'])
  for field in CONFIG_FIELDS:
    if stored.get(field) != requested.get(field):
      diffs.append((field, stored.get(field), requested.get(field)))
  # Configs written before layouts were recorded stored one column per field.
  layouts = [packing.stored_layout(c) for c in (stored, requested)]
  if layouts[0]['name'] != layouts[1]['name']:
    diffs.append(('layout', layouts[0]['name'], layouts[1]['name']))
  elif layouts[0] != layouts[1] and not diffs:  # Not just another spec.
    diffs.append(('layout (byte layout)', layouts[0], layouts[1]))
  stored_tables = [tables_lib.normalize_stored(
      t, capacity=stored.get('capacity'),
      sequence_length=stored.get('sequence_length'),
      stride_length=stored.get('stride_length')) for t in stored['tables']]
  diffs += tables_lib.diff_table_configs(stored_tables, requested['tables'])
  return diffs


def diff_versions(stored: dict, installed: Optional[dict] = None
                  ) -> List[Tuple[str, Any, Any]]:
  """Lists the `VERSION_FIELDS` packages whose versions differ.

  Args:
    stored: the `versions` entry of a manifest.
    installed: what `package_versions()` returns; computed when None.

  Returns:
    `('versions/<package>', stored_version, installed_version)` tuples.
  """
  installed = installed or package_versions()
  return [(f'versions/{name}', stored.get(name), installed.get(name))
          for name in VERSION_FIELDS if stored.get(name) != installed.get(name)]


def format_differences(diffs: List[Tuple[str, Any, Any]],
                       left: str = 'checkpoint',
                       right: str = 'requested') -> str:
  """Formats differences as one indented line per field.

  Args:
    diffs: `(field, left_value, right_value)` tuples.
    left: label of the first value.
    right: label of the second value.

  Returns:
    A multi-line string, e.g. "  capacity: checkpoint=50000, requested=1000".
  """
  return '\n'.join(f'  {field}: {left}={a!r}, {right}={b!r}'
                   for field, a, b in diffs)


def sequence_table(manifest: Dict[str, Any], table: Optional[str]) -> str:
  """`table`, or the first sequence table; checks it is a sequence table.

  Args:
    manifest: a checkpoint's manifest (or buffer config).
    table: a table name, or None for the first sequence table.

  Returns:
    The table name.

  Raises:
    ValueError: if `table` is unknown or not a sequence table.
  """
  sequence = [t['name'] for t in manifest['tables']
              if t.get('kind', 'sequence') == 'sequence' and
              t.get('block_length') is None]
  blocks = [t['name'] for t in manifest['tables']
            if t.get('block_length') is not None]
  table = table or (sequence[0] if sequence else None)
  if table not in sequence:
    raise ValueError(
        f'export and plots read the steps of a sequence table; the buffer '
        f'has sequence tables {sequence} (of '
        f'{[t["name"] for t in manifest["tables"]]}), got {table!r}.'
        + (f' Tables of packed items ({blocks}) hold blocks that do not say '
           'where in their episode they start; add a sequence table without '
           'block_length to export the steps.' if blocks else ''))
  return table
