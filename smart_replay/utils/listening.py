"""Which addresses a TCP port listens on, as the kernel says.

`addresses(port)` reads the listening sockets of `/proc/net/tcp` and
`/proc/net/tcp6` (of this process only, by default: its sockets' inodes in
`/proc/self/fd`), for checks that a server listens where it was asked to.
"""

import ipaddress
import os
import struct
from typing import List, Optional

_TCP_LISTEN = '0A'


def _socket_inodes() -> Optional[set]:
  """The inodes of this process's sockets (None if /proc cannot be read)."""
  inodes = set()
  try:
    names = os.listdir('/proc/self/fd')
  except OSError:
    return None
  for name in names:
    try:
      target = os.readlink(f'/proc/self/fd/{name}')
    except OSError:
      continue  # Closed meanwhile.
    if target.startswith('socket:['):
      inodes.add(target[len('socket:['):-1])
  return inodes


def _address(hex_address: str) -> str:
  """An address of /proc/net/tcp{,6} as `ipaddress` writes it (an IPv4
  address mapped into IPv6 as IPv4)."""
  raw = bytes.fromhex(hex_address)
  # The kernel prints each 32-bit word in host (little-endian) order.
  raw = b''.join(struct.pack('<I', struct.unpack('>I', raw[i:i + 4])[0])
                 for i in range(0, len(raw), 4))
  address = ipaddress.ip_address(raw)
  return str(getattr(address, 'ipv4_mapped', None) or address)


def addresses(port: int, *, own: bool = True) -> List[str]:
  """The addresses that listen on TCP `port` in this network namespace.

  Args:
    port: the port.
    own: only this process's sockets (else every process's).

  Returns:
    Sorted addresses ('::' and '0.0.0.0' are every interface).

  Raises:
    OSError: if /proc/net/tcp and tcp6 (or /proc/self/fd) cannot be read.
  """
  inodes = _socket_inodes() if own else None
  if own and inodes is None:
    raise OSError('cannot read /proc/self/fd to find the sockets '
                           'of this process.')
  found, readable = set(), False
  for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    try:
      with open(table) as f:
        lines = f.read().splitlines()[1:]
    except OSError:
      continue
    readable = True
    for line in lines:
      fields = line.split()
      address, port_hex = fields[1].split(':')
      if (fields[3] != _TCP_LISTEN or int(port_hex, 16) != port or
          (own and fields[9] not in inodes)):
        continue
      found.add(_address(address))
  if not readable:
    raise OSError('cannot read /proc/net/tcp or /proc/net/tcp6 to '
                           f'check the address port {port} listens on.')
  return sorted(found)
