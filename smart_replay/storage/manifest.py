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

MANIFEST_NAME = 'manifest.json'
FORMAT = 'smart_replay.checkpointing.manifest/1'
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


def build_manifest(config: dict, *, counts: dict, files: dict,
                   checkpoint_name: str, extra: Optional[dict] = None) -> dict:
  """Assembles a full manifest for one checkpoint.

  Args:
    config: what `record.build_config` returned.
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

  The file has mode 0600 (only its owner reads it), whatever the umask; a
  link in the temporary file's place is not followed (`OSError`).

  Args:
    path: destination file path.
    manifest: the manifest dict.
  """
  tmp = path + '.tmp'
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
               0o600)
  os.fchmod(fd, 0o600)  # Also when a crash left an older temporary file.
  with os.fdopen(fd, 'w') as f:
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
