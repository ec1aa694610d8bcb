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

from smart_replay import errors
from smart_replay.backends import starter as starter_lib
from smart_replay.control import client as control_client
from smart_replay.control import protocol
from smart_replay.control import credentials as credentials_lib
from smart_replay.server import local_server as server_lib
from smart_replay.layouts import packed_steps
from smart_replay.spec import specs
from smart_replay.storage import checkpoint_folders as checkpoints_lib
from smart_replay.tools import provenance as provenance_lib
from smart_replay.utils import progress_log
from smart_replay.writing import counters


# Checkpoints larger than this in all (about 0.5 s of reading and hashing
# at the ~700 MB/s measured on a 2-core machine) show verification progress.
PROGRESS_BYTES = 256 << 20


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


def _bytes(path: str) -> int:
  """The size of a checkpoint folder's files."""
  return sum(os.path.getsize(os.path.join(path, name))
             for name in os.listdir(path)
             if os.path.isfile(os.path.join(path, name)))


def _verify_all(found: List[str]) -> List[Tuple[Dict[str, Any],
                                                  Optional[dict]]]:
  """Describes (and verifies: reads every byte) each checkpoint, showing
  progress in MB when there is more than `PROGRESS_BYTES` to read."""
  sizes = [_bytes(path) for path in found]
  if sum(sizes) <= PROGRESS_BYTES:
    return [_checkpoint_entry(path, size) for path, size in zip(found, sizes)]
  described, done = [], 0
  with progress_log.ProgressLog('inspect: verifying checkpoints',
                                sum(sizes) >> 20, 'MB', every_s=2.0) as shown:
    for path, size in zip(found, sizes):
      described.append(_checkpoint_entry(path, size))
      done += size
      shown.update(done >> 20)
  return described


def _checkpoint_entry(path: str, size: int
                      ) -> Tuple[Dict[str, Any], Optional[dict]]:
  """`(description, manifest)` of one checkpoint; no manifest if damaged."""
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
    'episodes', 'extra', 'versions', 'provenance', 'starter',
    'checkpoints': [...]}`; `starter` is a run's read-only starter table
    (`backends.starter.StarterSource.reference()` plus its `state` at that path:
    'found', 'missing: ...' or 'DIFFERENT: ...'), else None;
    the tables and spec come from the newest checkpoint that verifies. The
    counts (`env_steps`, `episodes`, a table's `items` and
    `item_episodes`) are defined in `smart_replay.writing.counters`; a table's
    `size` is an older name of its `items`.

  Raises:
    CheckpointNotFoundError: if there is no checkpoint at `source`.
    CheckpointCorruptError: if no checkpoint there verifies; lists why.
  """
  found = checkpoints_lib.find_checkpoints(source)  # Newest first.
  described = _verify_all(found)
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
        'items': counts['items'], 'size': counts['items'],
        'item_episodes': _episodes(config, counts),
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
          'layout': packed_steps.stored_name(manifest),
          'frame_stack': packed_steps.stored_layout(manifest).get(
              'frame_stack'),
          'sequence_length': manifest['sequence_length'],
          'stride_length': manifest['stride_length'],
          'capacity': manifest['capacity'],
          'env_steps': manifest['counts']['env_steps'],
          'episodes': manifest['counts']['episodes'],
          'extra': manifest.get('extra', {}),
          'versions': manifest.get('versions', {}),
          'provenance': provenance,
          'starter': _starter(manifest.get('starter')),
          'checkpoints': list(reversed(entries))}


def _starter(reference: Optional[Dict[str, Any]]
             ) -> Optional[Dict[str, Any]]:
  """A run's starter reference, and whether its path still holds it."""
  if reference is None:
    return None
  found = []
  try:
    for path in checkpoints_lib.find_checkpoints(reference['path']):
      try:
        found.append(starter_lib.fingerprint(
            checkpoints_lib.read_manifest(path)))
      except errors.CheckpointCorruptError:
        continue
  except errors.CheckpointNotFoundError:
    state = 'missing: pass its new path as starter_dir when loading'
  else:
    state = ('found' if reference['fingerprint'] in found else
             f"DIFFERENT: holds fingerprints {found}, not "
             f"{reference['fingerprint']}")
  return {**reference, 'state': state}


def describe_server(address: str, *, timeout_s: float = 10.0,
                    control_address: Optional[str] = None,
                    credentials: Optional[
                        credentials_lib.ClientCredentials] = None
                    ) -> Dict[str, Any]:
  """Describes the buffer a running `smart-replay-serve` holds.

  Args:
    address: its Reverb 'host:port'.
    timeout_s: how long to wait for each answer.
    control_address: its control service; default port + 1.
    credentials: what its control service requires; None: what
      `ClientCredentials.resolve()` finds in the environment.

  Returns:
    The same keys as `describe_checkpoints` (live table counts, no
    provenance; checkpoint paths are on the server's machine).

  Raises:
    ServerUnavailableError: if the server or its control service does not
      answer in time.
    AuthenticationError: if the control service refused the credentials.
  """
  info = server_lib.server_info(reverb.Client(address), timeout_s)
  control = control_client.ControlClient(
      control_address or protocol.control_address_for(address),
      credentials=credentials or credentials_lib.ClientCredentials.resolve())
  try:
    served = control.call(protocol.INFO, timeout_s=timeout_s)
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
        'items': live.current_size, 'size': live.current_size,
        'item_episodes': _episodes(table, {'episodes': live.num_episodes}),
        'inserts': live.rate_limiter_info.insert_stats.completed,
        'samples': live.rate_limiter_info.sample_stats.completed,
        'rate_limiter': _limiter(table),
        'max_times_sampled': live.max_times_sampled}
  return {'source': address, 'checkpoint': None, 'tables': tables,
          'spec': _spec(config['data_spec']),
          'layout': packed_steps.stored_name(config),
          'frame_stack': packed_steps.stored_layout(config).get('frame_stack'),
          'sequence_length': config['sequence_length'],
          'stride_length': config['stride_length'],
          'capacity': config['capacity'], 'env_steps': None,
          'episodes': None, 'extra': {}, 'versions': {}, 'provenance': None,
          'checkpoints': [{'path': p, 'name': os.path.basename(p)}
                          for p in served['checkpoints']]}


def describe(target: str, *, timeout_s: float = 10.0,
             credentials: Optional[credentials_lib.ClientCredentials] = None
             ) -> Dict[str, Any]:
  """Describes a buffer directory, checkpoint folder or server address.

  Args:
    target: a path that exists, or 'host:port'.
    timeout_s: for a server, how long to wait for each answer.
    credentials: for a server, what its control service requires (see
      `describe_server`).

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
    return describe_server(target, timeout_s=timeout_s,
                           credentials=credentials)
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
  state = provenance and provenance_lib.collection_state(provenance)
  if not state:
    return []
  return [f'  {state}']


def _number(value: Optional[int]) -> str:
  return 'unknown' if value is None else f'{value:,}'


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
  if d.get('frame_stack'):
    lines[-1] += (f" frame_stack=({d['frame_stack']['field']}, axis "
                  f"{d['frame_stack']['axis']}: each frame stored once, "
                  f"{d['frame_stack'].get('codec', 'zlib')})")
  if d['env_steps'] is not None:
    first = next(iter(d['tables'].values()), None)
    lines.append('  ' + counters.format_counts(
        env_steps=d['env_steps'], episodes=d['episodes'],
        items=None if first is None else first['items']))
  lines += _collection_state(d['provenance'])
  lines.append('Tables:')
  for name, t in d['tables'].items():
    lines.append(
        f"  {name}: {t['kind']}, {t['sampler']} sampler, {t['remover']} "
        f"remover, {t['items']:,}/{t['capacity']:,} {t['unit']}"
        + ('' if t['item_episodes'] is None else
           f", item episodes {t['item_episodes']:,} (the unfinished one "
           'included)') + f", inserts {_number(t['inserts'])}, samples "
        f"{_number(t['samples'])}, rate limiter {t['rate_limiter']}")
  starter = d.get('starter')
  if starter:
    lines.append(
        f"  starter (read-only, mixed into batches; not in these "
        f"checkpoints): table {starter['table']!r} of {starter['path']}, "
        f"{starter['items']:,} items, fingerprint {starter['fingerprint']}"
        f" ({os.path.basename(starter['checkpoint'])}): {starter['state']}")
  lines.append('Spec:')
  lines += _spec_tree(d['spec'])
  if d['provenance']:
    lines.append('Provenance:')
    for key, value in d['provenance'].items():
      # The spec is shown above; legacy keys repeat counts under old names.
      if key != 'data_spec' and key not in provenance_lib.LEGACY_KEYS:
        text = json.dumps(value)
        shown = text[:117] + '...' if len(text) > 120 else text
        lines.append(f'  {key}: {shown}')
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
