"""The status line a `ReplayServer` logs at an interval.

One line per interval: the served address; per table its items, insert and
sample rates since the previous line, and whether its rate limiter blocks
inserts; the last checkpoint; what the previous server lost at a crash; and
whether scheduled checkpoints fail.
"""

from typing import Any, Dict, Optional

from smart_replay.remote import schedule as schedule_lib

SECURITY_WARNING = (
    'SECURITY: Reverb (port {port}) and the control service (port '
    '{control_port}) listen on ALL network interfaces, with no '
    'authentication and no encryption. Anyone who can reach these ports can '
    'read, write, delete and checkpoint this buffer. Serve on one machine '
    '(clients use localhost) or on a private network, or reach it through '
    'an SSH tunnel or VPN; never expose these ports to the internet '
    '(README: "Security").')


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
    parts.append(f"the previous server lost {restart_loss['lost_items']}"
                 ' item(s) at its crash')
  if schedule.failing_since is not None:
    since, message = schedule.failing_since
    parts.append(f'CHECKPOINTS FAILING for {now - since:.0f} s (retry in '
                 f'{max(schedule.retry_at - now, 0):.0f} s): {message}')
  return ' | '.join(parts)
