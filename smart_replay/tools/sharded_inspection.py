"""What `smart-replay-inspect` shows of a sharded buffer (and of any other).

A sharded buffer is named by its shards' addresses, comma-separated
(`h1:8000,h2:8000,h3:8000`). `describe` asks each shard (as
`inspection.describe_server` does), sums the tables over the shards that
answered, and reads the coordinated checkpoints every shard holds; any other
target is `inspection.describe`'s.
"""

import concurrent.futures
from typing import Any, Dict, List, Optional

from smart_replay import errors
from smart_replay.control import client as control_client
from smart_replay.control import protocol
from smart_replay.control import credentials as credentials_lib
from smart_replay.tools import inspection

# Table counts summed over the shards.
_SUMMED = ('items', 'size', 'capacity', 'inserts', 'samples')


def shard_addresses(target: str) -> List[str]:
  """The shards' addresses if `target` names a sharded buffer, else [].

  Args:
    target: what the user gave, e.g. 'h1:8000,h2:8000'.

  Returns:
    The addresses, or [] if `target` has no comma.

  Raises:
    ValueError: if a part is not 'host:port' (names it).
  """
  if ',' not in target:
    return []
  addresses = [part.strip() for part in target.split(',')]
  for address in addresses:
    host, _, port = address.rpartition(':')
    if not host or not port.isdigit():
      raise ValueError(f"a sharded buffer is named by 'host:port' addresses "
                       f'separated by commas; {address!r} in {target!r} is '
                       'not one.')
  return addresses


def describe_shards(addresses: List[str], *, timeout_s: float = 10.0,
                    credentials: Optional[
                        credentials_lib.ClientCredentials] = None
                    ) -> Dict[str, Any]:
  """Describes a buffer sharded over running `smart-replay-serve`s.

  Args:
    addresses: every shard's Reverb 'host:port'.
    timeout_s: how long to wait for each shard's answers (all shards are
      asked at once).
    credentials: what the shards' control services require; None: what
      `ClientCredentials.resolve()` finds in the environment.

  Returns:
    Shard 0's description (spec, lengths, layout) with `source` the
    addresses, `tables` summed over the shards that answered, and `shards`:
    per shard `{'address', 'up', 'tables' or 'error'}`; `coordinated`: the
    ids of the coordinated checkpoints recorded on every shard, oldest first.

  Raises:
    ServerUnavailableError: if no shard answers.
  """
  credentials = credentials or credentials_lib.ClientCredentials.resolve()
  shards, described = [], []
  with concurrent.futures.ThreadPoolExecutor(len(addresses)) as pool:
    asked = [pool.submit(inspection.describe_server, address,
                         timeout_s=timeout_s, credentials=credentials)
             for address in addresses]
  for address, answer in zip(addresses, asked):  # All waited in parallel.
    try:
      one = answer.result()
    except errors.SmartReplayError as e:
      shards.append({'address': address, 'up': False, 'error': str(e)})
      continue
    described.append(one)
    shards.append({'address': address, 'up': True, 'tables': one['tables']})
  if not described:
    raise errors.ServerUnavailableError(
        f'none of the {len(addresses)} shards answered within {timeout_s:g} '
        f's: ' + '; '.join(s['error'] for s in shards))
  result = dict(described[0], source=','.join(addresses), shards=shards,
                capacity=sum(d['capacity'] for d in described),
                checkpoints=[{'path': f"{d['source']} {c['path']}",
                              'name': c['name']}
                             for d in described for c in d['checkpoints']])
  result['tables'] = {name: dict(table) for name, table in
                      described[0]['tables'].items()}
  for name, table in result['tables'].items():
    for key in _SUMMED:
      values = [d['tables'][name][key] for d in described]
      table[key] = None if None in values else sum(values)
  result['coordinated'] = _common_coordinated(
      [s['address'] for s in shards if s['up']], timeout_s, credentials)
  return result


def _common_coordinated(addresses: List[str], timeout_s: float,
                        credentials: credentials_lib.ClientCredentials
                        ) -> List[str]:
  """Ids of the coordinated checkpoints every answering shard records."""
  held = []
  for address in addresses:
    control = control_client.ControlClient(
        protocol.control_address_for(address), credentials=credentials)
    try:
      held.append({r['id'] for r in control.call(
          protocol.COORDINATED_LIST, timeout_s=timeout_s)['records']})
    except errors.SmartReplayError:
      held.append(set())
    finally:
      control.close()
  return sorted(set.intersection(*held)) if held else []


def describe(target: str, *, timeout_s: float = 10.0,
             credentials: Optional[credentials_lib.ClientCredentials] = None
             ) -> Dict[str, Any]:
  """Describes a sharded buffer (comma-separated addresses) or any target
  `inspection.describe` takes.

  Args:
    target: the buffer.
    timeout_s: how long to wait for each server's answers.
    credentials: what servers' control services require (see
      `inspection.describe_server`).

  Returns:
    `describe_shards` or `inspection.describe`.

  Raises:
    ValueError: if a comma-separated part is not 'host:port'.
    CheckpointNotFoundError, CheckpointCorruptError, ServerUnavailableError:
      as `inspection.describe`.
  """
  addresses = shard_addresses(target)
  if addresses:
    return describe_shards(addresses, timeout_s=timeout_s,
                           credentials=credentials)
  return inspection.describe(target, timeout_s=timeout_s,
                             credentials=credentials)


def format_text(description: Dict[str, Any]) -> str:
  """`inspection.format_text`, then each shard and the coordinated
  checkpoints of a sharded buffer.

  Args:
    description: what `describe` returned.

  Returns:
    Multi-line text.
  """
  text = inspection.format_text(description)
  if 'shards' not in description:
    return text
  lines = [f"Shards ({len(description['shards'])}; tables above are summed "
           'over those up):']
  for k, shard in enumerate(description['shards']):
    if not shard['up']:
      lines.append(f"  {k} {shard['address']}: DOWN ({shard['error']})")
      continue
    lines.append(f"  {k} {shard['address']}: " + ', '.join(
        f"{name} {t['items']:,}/{t['capacity']:,} items, inserts "
        f"{t['inserts']:,}, samples {t['samples']:,}"
        for name, t in shard['tables'].items()))
  ids = description['coordinated']
  lines.append(f"Coordinated checkpoints on every shard up: {len(ids)}"
               + (f", newest {ids[-1]}" if ids else ''))
  return text + '\n' + '\n'.join(lines)
