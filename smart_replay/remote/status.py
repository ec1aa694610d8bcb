"""The status line a `ReplayServer` logs at an interval.

One line per interval: the served address; per table its items, insert and
sample rates since the previous line, and whether its rate limiter blocks
inserts; the last checkpoint; what the previous server lost at a crash;
whether scheduled checkpoints fail; and how many connections of other users
to Reverb's port were refused.
"""

import ipaddress
from typing import Any, Dict, Optional

from smart_replay.ops import bind_address
from smart_replay.remote import checkpoint_schedule as schedule_lib
from smart_replay.utils import listening

def security_warning(*, port: int, control_host: str, control_port: int,
                     access: str) -> str:
  """The line a server logs once at start about what its ports allow.

  Where Reverb's port listens is read from the kernel (this process's
  sockets, `listening.addresses`), not assumed.

  Args:
    port: the Reverb port.
    control_host: the address the control service binds.
    control_port: its port.
    access: how the control service is protected (`describe()`).

  Returns:
    The warning.
  """
  cap = bind_address.connection_cap()
  capped = (f'; at most {cap[1]} connections per peer' if cap and
            cap[0] == control_port else '; no per-peer connection cap')
  return (
      f'SECURITY: the control service listens on {control_host}:'
      f'{control_port} ({access}{capped}). {_reverb_reach(port)}. See the '
      'section "Security" of docs/remote.md.')


def _reverb_reach(port: int) -> str:
  """Who can reach Reverb's port, and what to do about it."""
  try:
    found = listening.addresses(port)
  except OSError:
    found = []
  tables = 'read, write and reset the buffer\'s tables'
  if found and not set(found) & set(bind_address.EVERY_INTERFACE):
    where = f'Reverb (port {port}) listens on {" and ".join(found)} only'
    screened = (bind_address.in_force() or (None,))[0] == port
    users = ('connections from other users of this machine are refused (their'
             ' socket\'s owner, asked of the kernel)' if screened else
             f'every user of this machine can {tables}; on a shared machine,'
             ' admit only your user with an owner-matched firewall rule')
    if all(ipaddress.ip_address(a).is_loopback for a in found):
      return (f'{where}, with no authentication and no encryption: other '
              f'machines cannot reach it, and {users}')
    return (f'{where}, with no authentication and no encryption: anyone on '
            f'its network who reaches that address can {tables} (admit only '
            f'the actor and learner machines with a firewall rule), and '
            f'{users}')
  return (f'Reverb (port {port}) listens on ALL network interfaces with no '
          f'authentication and no encryption: anyone who can reach that port'
          f' can {tables}. Close it to other machines with a firewall rule '
          'or a network namespace, serve on a private network, or keep it on'
          ' one address (smart-replay-serve --reverb_host, 127.0.0.1 by '
          'default)')


def status_line(*, address: str, stats: Dict[str, Any],
                before: Dict[str, Any], elapsed_s: float,
                schedule: schedule_lib.CheckpointSchedule,
                restart_loss: Optional[Dict[str, Any]], now: float) -> str:
  """Formats one status line.

  Args:
    address: the served 'host:port'.
    stats: `manager.stats()` now.
    before: `manager.stats()` at the previous line (rates are since then).
    elapsed_s: seconds since the previous line.
    schedule: the server's checkpoint schedule.
    restart_loss: `serving_record.lost_since` at start-up, or None.
    now: `time.monotonic()` now.

  Returns:
    The parts joined by ' | '.
  """
  elapsed_s = max(elapsed_s, 1e-9)
  parts = [f'serving {address}']
  for name, table in stats['tables'].items():
    old = before['tables'][name]
    parts.append(
        f"{name}: {table['items']:,}/{table['max_size']:,} items, "
        f"{(table['inserts'] - old['inserts']) / elapsed_s:,.1f} inserts/s, "
        f"{(table['samples'] - old['samples']) / elapsed_s:,.1f} samples/s"
        + ('' if table['rate_limiter']['can_insert'] else
           ', INSERTS BLOCKED by its rate limiter'))
  if schedule.last_checkpoint:
    ago = now - schedule.last_time
    parts.append(f'last checkpoint {schedule.last_checkpoint} '
                 f'({max(ago, 0):.0f} s ago)')
  else:
    parts.append('no checkpoint yet')
  if restart_loss and restart_loss['lost_items']:
    if restart_loss.get('cause') == 'restore':
      parts.append(f"the last restore dropped {restart_loss['lost_items']}"
                   ' item(s) inserted after its checkpoint')
    else:
      parts.append(f"the previous server lost {restart_loss['lost_items']}"
                   ' item(s) at its crash')
  if schedule.failing_since is not None:
    since, message = schedule.failing_since
    parts.append(f'CHECKPOINTS FAILING for {now - since:.0f} s (retry in '
                 f'{max(schedule.retry_at - now, 0):.0f} s): {message}')
  refused = bind_address.refused_connections()
  if refused:
    parts.append(f'refused {refused:,} connection(s) of other users of this '
                 'machine to Reverb')
  over_cap = bind_address.refused_over_cap()
  if over_cap:
    parts.append(f'refused {over_cap:,} control connection(s) over the '
                 'per-peer cap')
  return ' | '.join(parts)
