"""The control service of a standalone buffer server (`smart-replay-serve`).

Reverb's gRPC port carries the data; what Reverb cannot do remotely (describe
the buffer's configuration, write a verified checkpoint with a manifest, read
per-item sample counts) goes through this small gRPC service, served by the
same process on its own port (by default the Reverb port + 1). Requests and
answers are JSON objects; every call has a deadline, and an error raised by
the server is raised again on the client as the same `smart_replay.errors`
class with the server's message.

Like Reverb, the service listens on all interfaces without authentication or
TLS: run it on loopback, a private network or behind a tunnel (see README).
"""

import concurrent.futures
import json
from typing import Any, Callable, Dict, Optional

import grpc

from smart_replay import errors

SERVICE = 'smart_replay.Control'
# No size limit: `times_sampled` lists every item of a large table.
_OPTIONS = [('grpc.max_send_message_length', -1),
            ('grpc.max_receive_message_length', -1)]

Handler = Callable[[Dict[str, Any]], Dict[str, Any]]


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


def control_address_for(server_address: str) -> str:
  """The default control address of a Reverb server.

  Args:
    server_address: the Reverb server's 'host:port'.

  Returns:
    'host:port+1'.

  Raises:
    ValueError: if `server_address` is not 'host:port'.
  """
  host, _, port = server_address.rpartition(':')
  if not host or not port.isdigit():
    raise ValueError(f"server_address must be 'host:port', got "
                     f'{server_address!r}.')
  return f'{host}:{default_control_port(int(port))}'


def _encode(message: Dict[str, Any]) -> bytes:
  return json.dumps(message).encode('utf-8')


def _decode(data: bytes) -> Dict[str, Any]:
  return json.loads(data.decode('utf-8'))


class ControlServer:
  """Serves `handlers` ({method: fn(request) -> answer}) on a gRPC port.

  A handler's `SmartReplayError`/`ValueError` reaches the client as the same
  error class and message; anything else as a `RuntimeError`.

  Args:
    handlers: JSON-in, JSON-out functions by method name.
    port: TCP port to listen on (all interfaces, like Reverb).
    max_workers: calls served at the same time.

  Raises:
    ValueError: if `handlers` is empty or the port cannot be bound.
  """

  def __init__(self, handlers: Dict[str, Handler], *, port: int,
               max_workers: int = 4):
    if not handlers:
      raise ValueError('handlers must name at least one method, got {}.')
    self._server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(
            max_workers, thread_name_prefix='smart_replay_control'),
        # gRPC shares a port already in use (SO_REUSEPORT) by default.
        options=_OPTIONS + [('grpc.so_reuseport', 0)])
    self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        SERVICE, {name: grpc.unary_unary_rpc_method_handler(
            self._wrap(fn), request_deserializer=_decode,
            response_serializer=_encode) for name, fn in handlers.items()})])
    try:
      self.port = self._server.add_insecure_port(f'[::]:{port}')
    except RuntimeError as e:
      raise ValueError(f'the control service cannot listen on port {port} '
                       f'({e}); pass another control port.') from e
    if not self.port:
      raise ValueError(f'the control service cannot listen on port {port} '
                       '(in use?); pass another control port.')
    self._server.start()

  @staticmethod
  def _wrap(fn: Handler):
    def call(request, context):
      del context
      try:
        return {'result': fn(request)}
      except (errors.SmartReplayError, ValueError) as e:
        return {'error': {'type': type(e).__name__, 'message': str(e)}}
      except Exception as e:  # pylint: disable=broad-except
        return {'error': {'type': 'RuntimeError',
                          'message': f'{type(e).__name__}: {e}'}}
    return call

  def stop(self, grace_s: float = 5.0) -> None:
    """Stops serving; calls in progress get some time to finish.

    Args:
      grace_s: seconds the calls in progress get.
    """
    self._server.stop(grace_s).wait(grace_s + 1)


class ControlClient:
  """Calls a `ControlServer` at `address` ('host:port'), with deadlines.

  Args:
    address: the control service's 'host:port'.
  """

  def __init__(self, address: str):
    self.address = address
    self._channel = grpc.insecure_channel(address, options=_OPTIONS)

  def call(self, method: str, request: Optional[Dict[str, Any]] = None, *,
           timeout_s: float) -> Any:
    """Calls `method` and returns its answer.

    Args:
      method: the handler's name, e.g. 'info' or 'checkpoint'.
      request: its JSON-serializable arguments.
      timeout_s: the deadline of the call, in seconds.

    Returns:
      The handler's JSON answer.

    Raises:
      ServerUnavailableError: if no answer came within `timeout_s`.
      SmartReplayError, ValueError, RuntimeError: what the handler raised,
        with its message; RuntimeError for other gRPC failures.
    """
    stub = self._channel.unary_unary(f'/{SERVICE}/{method}',
                                     request_serializer=_encode,
                                     response_deserializer=_decode)
    try:
      answer = stub(request or {}, timeout=timeout_s, wait_for_ready=True)
    except grpc.RpcError as e:
      code = e.code()  # pylint: disable=no-member
      if code in (grpc.StatusCode.DEADLINE_EXCEEDED,
                  grpc.StatusCode.UNAVAILABLE):
        raise errors.ServerUnavailableError(
            f'the smart_replay control service at {self.address} did not '
            f'answer {method!r} within {timeout_s:g} s ({code.name}): it is '
            'not reachable (is smart-replay-serve running, and its control '
            'port open from here?), or still working on a long request (a '
            'large checkpoint).') from None
      raise RuntimeError(
          f'the smart_replay control service at {self.address} failed on '
          f'{method!r}: {code.name} {e.details()}') from None  # pylint: disable=no-member
    if 'error' in answer:
      kind = getattr(errors, answer['error']['type'], None)
      if not (isinstance(kind, type) and issubclass(kind, Exception)):
        kind = ValueError if answer['error']['type'] == 'ValueError' else \
            RuntimeError
      raise kind(f'(from the server at {self.address}) '
                 f"{answer['error']['message']}")
    return answer['result']

  def close(self) -> None:
    """Closes the channel; safe to call more than once."""
    self._channel.close()
