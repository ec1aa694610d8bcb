"""Choosing TCP ports that a busy machine does not take away meanwhile.

A port the kernel hands out for `bind(0)` comes from the ephemeral range
(`/proc/sys/net/ipv4/ip_local_port_range`, usually 32768-60999): the same
range every outgoing connection's local port is drawn from, so on a host that
opens many connections it is soon someone's client port again. Ports chosen
here lie outside that range, drawn at random among those free, and always in
pairs: `free_port_pair()` returns a port P with P + 1 free too, for the
control service a standalone server runs beside Reverb.
"""

import random
from typing import Optional, Tuple

import portpicker

# Where ports are drawn from below the ephemeral range (above the well-known
# and most registered services' ports).
LOWEST = 20000
_FALLBACK_EPHEMERAL = (32768, 60999)
DEFAULT_ATTEMPTS = 200


def ephemeral_range() -> Tuple[int, int]:
  """Returns the kernel's ephemeral port range `(low, high)`, inclusive."""
  try:
    with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
      low, high = (int(v) for v in f.read().split())
    return low, high
  except (OSError, ValueError):
    return _FALLBACK_EPHEMERAL


def _candidates() -> Tuple[range, ...]:
  """The ranges pairs are drawn from: below the ephemeral range, else above
  it, else anywhere unprivileged."""
  low, high = ephemeral_range()
  spans = tuple(r for r in (range(LOWEST, low - 1), range(high + 1, 65535))
                if len(r) >= 1000)
  return spans or (range(1024, 65535),)


def is_free(port: int) -> bool:
  """Whether nothing listens on or holds `port` (TCP and UDP, IPv4/IPv6).

  Args:
    port: the port.

  Returns:
    True if it can be bound now.
  """
  return 0 < port < 65536 and bool(portpicker.is_port_free(port))


def free_port_pair(*, attempts: int = DEFAULT_ATTEMPTS,
                   rng: Optional[random.Random] = None) -> int:
  """Returns a port P such that P and P + 1 are free, outside the ephemeral
  range.

  Args:
    attempts: how many random candidates to try.
    rng: the random source (None: a fresh `random.SystemRandom`).

  Returns:
    P.

  Raises:
    OSError: if no free pair was found in `attempts` tries.
  """
  rng = rng or random.SystemRandom()
  spans = _candidates()
  for _ in range(attempts):
    span = rng.choice(spans)
    port = rng.randrange(span.start, span.stop)
    if is_free(port) and is_free(port + 1):
      return port
  raise OSError(f'no two free consecutive TCP ports found in {attempts} '
                f'tries outside the ephemeral range {ephemeral_range()}.')
