"""The control protocol: its methods, their classes, limits and addresses.

Every method of a server's control service is named here once; the server
(`smart_replay.remote`) serves handlers under these names, and clients
(`smart_replay.backends`, `smart_replay.tools`) call them by these names.
A request and an answer are JSON objects (`channel`).

Methods come in two classes that decide who may call them and how they are
served:

* `READ_ONLY_METHODS` change nothing: the reader token is enough
  (`tokens`);
* `SLOW_METHODS` may take long (checkpoints, restores): they are served a
  few at a time, first come first served (`channel`).
"""

import json
from typing import Any, Dict, FrozenSet

SERVICE = 'smart_replay.Control'

INFO = 'info'
CHECKPOINT = 'checkpoint'
TIMES_SAMPLED = 'times_sampled'
COORDINATED_SAVE = 'coordinated_save'
COORDINATED_COMMIT = 'coordinated_commit'
COORDINATED_LIST = 'coordinated_list'
COORDINATED_RESTORE = 'coordinated_restore'
WRITER_MARKS = 'writer_marks'

METHODS: FrozenSet[str] = frozenset({
    INFO, CHECKPOINT, TIMES_SAMPLED, COORDINATED_SAVE, COORDINATED_COMMIT,
    COORDINATED_LIST, COORDINATED_RESTORE, WRITER_MARKS})
READ_ONLY_METHODS: FrozenSet[str] = frozenset({
    INFO, TIMES_SAMPLED, COORDINATED_LIST, WRITER_MARKS})
SLOW_METHODS: FrozenSet[str] = frozenset({
    CHECKPOINT, TIMES_SAMPLED, COORDINATED_SAVE, COORDINATED_RESTORE,
    WRITER_MARKS})

# A request is a small JSON object; an answer may list a table's items.
MAX_REQUEST_BYTES = 1 << 20
MAX_ANSWER_BYTES = 64 << 20
# The longest deadline a call may ask for: the server refuses calls without
# a deadline or with a longer one, so no call holds a worker for longer.
MAX_CALL_S = 3600.0
# Connections one peer (a user of the server's machine, or another machine)
# may hold open to the service at once: enforced when it accepts them, where
# the process runs with the bind-address library (`smart-replay-serve` on one
# address; smart_replay/ops/bind_address.c).
MAX_CONNECTIONS_PER_PEER = 32

LOOPBACK = '127.0.0.1'
# How a call carries its token: gRPC metadata `authorization: Bearer <token>`.
METADATA_KEY = 'authorization'
SCHEME = 'Bearer '


def default_control_port(reverb_port: int) -> int:
  """The control port a server on `reverb_port` uses unless told otherwise.

  Args:
    reverb_port: the Reverb port.

  Returns:
    The Reverb port + 1.
  """
  return reverb_port + 1


def check_port(name: str, port: int) -> None:
  """Checks that `port` is a TCP port number.

  Args:
    name: the argument's name, for the message.
    port: its value.

  Raises:
    ValueError: if it is not an integer in 1..65535; names the argument.
  """
  if isinstance(port, bool) or not isinstance(port, int) or \
      not 0 < port < 65536:
    raise ValueError(f'{name} must be None or a TCP port, got {port!r}.')


def dial_address(address: str) -> str:
  """The address a client dials for 'host:port': 'localhost' as 127.0.0.1.

  gRPC resolves 'localhost' to ::1 first, where any user of the machine
  may listen; servers listen on 127.0.0.1.

  Args:
    address: 'host:port'.

  Returns:
    The same address, with the host 'localhost' replaced by 127.0.0.1.
  """
  host, sep, port = address.rpartition(':')
  if sep and host.lower() == 'localhost':
    return f'{LOOPBACK}:{port}'
  return address


def control_address_for(server_address: str) -> str:
  """The default control address of a Reverb server, to dial.

  Args:
    server_address: the Reverb server's 'host:port'.

  Returns:
    'host:port+1' ('localhost' as 127.0.0.1, `dial_address`).

  Raises:
    ValueError: if `server_address` is not 'host:port'.
  """
  host, _, port = server_address.rpartition(':')
  if not host or not port.isdigit():
    raise ValueError(f"server_address must be 'host:port', got "
                     f'{server_address!r}.')
  return dial_address(f'{host}:{default_control_port(int(port))}')


def encode(message: Dict[str, Any]) -> bytes:
  """A request or answer as sent: JSON, UTF-8.

  Args:
    message: a JSON-serializable object.

  Returns:
    Its bytes.
  """
  return json.dumps(message).encode('utf-8')


def decode(data: bytes) -> Any:
  """A request or answer as received.

  Args:
    data: its bytes.

  Returns:
    The decoded JSON value.

  Raises:
    ValueError, UnicodeDecodeError, RecursionError: if it is not UTF-8 JSON.
  """
  return json.loads(data.decode('utf-8'))
