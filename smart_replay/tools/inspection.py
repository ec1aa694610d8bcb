"""What a buffer holds: tables, spec, provenance and checkpoints.

`describe(target)` takes a buffer directory, one `ckpt-N` folder, or the
'host:port' of a running `smart-replay-serve`, and returns a JSON-friendly
dict; `format_text` renders it for people. A checkpoint is verified (files
against the manifest's digests) before it is described.
"""

import datetime
import json
import os
from typing import Any, Dict, List, Optional, Tuple

import reverb

from smart_replay.checkpointing import layout as checkpoints_lib
from smart_replay.remote import control as control_lib
from smart_replay import errors
from smart_replay.core import local_server as server_lib
from smart_replay.core import packing
from smart_replay.core import specs
from smart_replay.tools import provenance as provenance_lib


def _unit(config: Dict[str, Any]) -> str:
  """What a stored table config's items are: windows, or blocks of them."""
  if config.get('block_length') is None:
    return 'items'
  return (f"blocks (of {config['block_length']} steps, up to "
          f"{config['block_length'] - config['sequence_length'] + 1} windows)")


def _episodes(config: Dict[str, Any], counts: Dict[str, Any]
              ) -> Optional[int]:
  """Reverb's episode count of a table; None for packed items (one Reverb
  stream writes the blocks of every episode)."""
  return None if config.get('block_length') else counts.get('episodes')


def _capacity_in_items(config: Dict[str, Any]) -> int:
  """A stored table config's Reverb capacity (blocks, for packed items)."""
  if config.get('block_length') is None:
    return config['max_size']
  per_block = config['block_length'] - config['sequence_length'] + 1
  return -(-config['max_size'] // per_block)


def _limiter(config: Dict[str, Any]) -> str:
  if config.get('block_inserts_when_full'):
    return 'queue (inserts wait while full)'
  if config.get('samples_per_insert') is not None:
    return (f"samples_per_insert={config['samples_per_insert']:g} "
            f"(error_buffer={config['error_buffer']:g}, min_size_to_sample="
            f"{config['min_size_to_sample']})")
  return f"min_size_to_sample={config['min_size_to_sample']}"


def _spec(data_spec_json: Dict[str, Any]) -> List[Dict[str, Any]]:
  return [dict(leaf, shape=list(leaf['shape']),
               text=specs.SpecLeaf(**{**leaf, 'shape': tuple(leaf['shape'])}
                                   ).describe())
          for leaf in data_spec_json['leaves']]


def _checkpoint_entry(path: str) -> Tuple[Dict[str, Any], Optional[dict]]:
  """`(description, manifest)` of one checkpoint; no manifest if damaged."""
  size = sum(os.path.getsize(os.path.join(path, name))
             for name in os.listdir(path)
             if os.path.isfile(os.path.join(path, name)))
  entry = {'path': path, 'name': os.path.basename(path), 'bytes': size,
           'modified_utc': datetime.datetime.fromtimestamp(
               os.path.getmtime(path), datetime.timezone.utc).isoformat()}
  try:
    manifest = checkpoints_lib.verify(path)
  except errors.CheckpointCorruptError as e:
    return dict(entry, verified=False, problem=str(e)), None
  return dict(entry, verified=True, created_utc=manifest.get('created_utc'),
              items={n: c['items']
                     for n, c in manifest['counts']['tables'].items()},
              extra=manifest.get('extra', {})), manifest


def describe_checkpoints(source: str) -> Dict[str, Any]:
  """Describes a buffer directory or one checkpoint folder.

  Args:
    source: a buffer directory or a `ckpt-N` folder.

  Returns:
    `{'source', 'checkpoint', 'tables': {name: {...}}, 'spec': [leaves],
    'sequence_length', 'stride_length', 'capacity', 'env_steps',
    'episodes', 'extra', 'versions', 'provenance', 'checkpoints': [...]}`;
    the tables and spec come from the newest checkpoint that verifies.

  Raises:
    CheckpointNotFoundError: if there is no checkpoint at `source`.
    CheckpointCorruptError: if no checkpoint there verifies; lists why.
  """
  found = checkpoints_lib.find_checkpoints(source)  # Newest first.
  described = [_checkpoint_entry(path) for path in found]
  entries = [entry for entry, _ in described]
  usable = [(entry, manifest) for entry, manifest in described if manifest]
  if not usable:
    raise errors.CheckpointCorruptError(
        f'no checkpoint in {source} verifies: '
        + ' | '.join(e['problem'] for e in entries))
  newest, manifest = usable[0]
  tables = {}
  for config in manifest['tables']:
    counts = manifest['counts']['tables'][config['name']]
    tables[config['name']] = {
        'kind': config['kind'], 'sampler': config['sampler'],
        'remover': config['remover'], 'unit': _unit(config),
        'capacity': _capacity_in_items(config),
        'size': counts['items'], 'episodes': _episodes(config, counts),
        'inserts': counts.get('inserts'), 'samples': counts.get('samples'),
        'rate_limiter': _limiter(config),
        'max_times_sampled': config['max_times_sampled']}
  buffer_dir = checkpoints_lib.buffer_dir_of(newest['path'])
  try:
    provenance = provenance_lib.read_provenance(buffer_dir)
  except (OSError, ValueError):
    provenance = None
  return {'source': os.path.abspath(source),
          'checkpoint': newest['path'],
          'tables': tables, 'spec': _spec(manifest['data_spec']),
          'layout': packing.stored_name(manifest),
          'sequence_length': manifest['sequence_length'],
          'stride_length': manifest['stride_length'],
          'capacity': manifest['capacity'],
          'env_steps': manifest['counts']['env_steps'],
          'episodes': manifest['counts']['episodes'],
          'extra': manifest.get('extra', {}),
          'versions': manifest.get('versions', {}),
          'provenance': provenance,
          'checkpoints': list(reversed(entries))}


def describe_server(address: str, *, timeout_s: float = 10.0,
                    control_address: Optional[str] = None) -> Dict[str, Any]:
  """Describes the buffer a running `smart-replay-serve` holds.

  Args:
    address: its Reverb 'host:port'.
    timeout_s: how long to wait for each answer.
    control_address: its control service; default port + 1.

  Returns:
    The same keys as `describe_checkpoints` (live table counts, no
    provenance; checkpoint paths are on the server's machine).

  Raises:
    ServerUnavailableError: if the server or its control service does not
      answer in time.
  """
  info = server_lib.server_info(reverb.Client(address), timeout_s)
  control = control_lib.ControlClient(
      control_address or control_lib.control_address_for(address))
  try:
    served = control.call('info', timeout_s=timeout_s)
  finally:
    control.close()
  config = served['config']
  tables = {}
  for table in config['tables']:
    live = info[table['name']]
    tables[table['name']] = {
        'kind': table['kind'], 'sampler': table['sampler'],
        'remover': table['remover'], 'unit': _unit(table),
        'capacity': live.max_size,
        'size': live.current_size,
        'episodes': _episodes(table, {'episodes': live.num_episodes}),
        'inserts': live.rate_limiter_info.insert_stats.completed,
        'samples': live.rate_limiter_info.sample_stats.completed,
        'rate_limiter': _limiter(table),
        'max_times_sampled': live.max_times_sampled}
  return {'source': address, 'checkpoint': None, 'tables': tables,
          'spec': _spec(config['data_spec']),
          'layout': packing.stored_name(config),
          'sequence_length': config['sequence_length'],
          'stride_length': config['stride_length'],
          'capacity': config['capacity'], 'env_steps': None,
          'episodes': None, 'extra': {}, 'versions': {}, 'provenance': None,
          'checkpoints': [{'path': p, 'name': os.path.basename(p)}
                          for p in served['checkpoints']]}


def describe(target: str, *, timeout_s: float = 10.0) -> Dict[str, Any]:
  """Describes a buffer directory, checkpoint folder or server address.

  Args:
    target: a path that exists, or 'host:port'.
    timeout_s: for a server, how long to wait for each answer.

  Returns:
    See `describe_checkpoints`.

  Raises:
    CheckpointNotFoundError: if `target` is neither an existing path nor
      'host:port'.
    CheckpointCorruptError, ServerUnavailableError: see the two describers.
  """
  if os.path.exists(target):
    return describe_checkpoints(target)
  host, _, port = target.rpartition(':')
  if host and port.isdigit():
    return describe_server(target, timeout_s=timeout_s)
  return describe_checkpoints(target)  # Raises CheckpointNotFoundError.


def _spec_tree(leaves: List[Dict[str, Any]]) -> List[str]:
  lines, shown = [], set()
  for leaf in leaves:
    parts = leaf['path'].split('/')
    for depth in range(len(parts) - 1):
      prefix = '/'.join(parts[:depth + 1])
      if prefix not in shown:
        shown.add(prefix)
        lines.append('  ' * (depth + 1) + parts[depth] + '/')
    lines.append('  ' * len(parts) + f"{parts[-1]}: {leaf['text']}")
  return lines


def _collection_state(provenance) -> List[str]:
  """One line saying whether a populated buffer holds what was asked."""
  if not provenance or 'total_steps_requested' not in provenance:
    return []
  done = provenance.get('steps_collected', 0)
  wanted = provenance['total_steps_requested']
  if provenance.get('complete', done >= wanted):
    return [f'  collected {done:,} of {wanted:,} requested steps (complete)']
  return [f'  INTERRUPTED: collected {done:,} of {wanted:,} requested steps '
          '(the directory is named after the requested total); continue with '
          'smart-replay-populate --resume']


def format_text(description: Dict[str, Any]) -> str:
  """Renders `describe()`'s dict for a terminal.

  Args:
    description: what `describe` returned.

  Returns:
    Multi-line text: tables, spec tree, provenance, checkpoints.
  """
  d = description
  lines = [f"Buffer: {d['source']}"]
  if d['checkpoint']:
    lines.append(f"  newest verified checkpoint: {d['checkpoint']}")
  lines.append(f"  sequence_length={d['sequence_length']} stride_length="
               f"{d['stride_length']} capacity={d['capacity']:,} layout="
               f"{d['layout']}")
  if d['env_steps'] is not None:
    lines.append(f"  env steps {d['env_steps']:,}, episodes "
                 f"{d['episodes']:,} (finished)")
  lines += _collection_state(d['provenance'])
  lines.append('Tables:')
  for name, t in d['tables'].items():
    lines.append(
        f"  {name}: {t['kind']}, {t['sampler']} sampler, {t['remover']} "
        f"remover, {t['size']:,}/{t['capacity']:,} {t['unit']}"
        + ('' if t['episodes'] is None else
           f" from {t['episodes']} episodes (Reverb's count: the unfinished "
           'one included)') + f", inserts {t['inserts']}, samples {t['samples']}, "
        f"rate limiter {t['rate_limiter']}")
  lines.append('Spec:')
  lines += _spec_tree(d['spec'])
  if d['provenance']:
    lines.append('Provenance:')
    for key, value in d['provenance'].items():
      if key != 'data_spec':  # Shown above as the spec.
        text = json.dumps(value)
        lines.append(f'  {key}: {text[:117] + "..." if len(text) > 120 else text}')
  lines.append('Checkpoints:')
  for c in d['checkpoints']:
    if 'bytes' not in c:
      lines.append(f"  {c['path']}")
      continue
    state = 'ok' if c['verified'] else f"DAMAGED: {c['problem']}"
    lines.append(f"  {c['name']}: {c['bytes'] / 1e6:.2f} MB, "
                 f"{c.get('created_utc') or c['modified_utc']}, {state}"
                 + (f", items {c['items']}" if c['verified'] else ''))
  return '\n'.join(lines)
