"""The control service of a standalone buffer server (`smart-replay-serve`).

Reverb's gRPC port carries the data; what Reverb cannot do remotely (describe
the buffer's configuration, write a verified checkpoint with a manifest, read
per-item sample counts, coordinated checkpoints) goes through this small gRPC
service, served by the same process on its own port (by default the Reverb
port + 1). Requests and answers are JSON objects; every call has a deadline,
and an error raised by the server is raised again on the client as the same
`smart_replay.errors` class with the server's message.

Unlike Reverb's port, this one can be kept safe (`control_access`): it binds
loopback unless told otherwise, and every call must carry the server's token.
It is bounded too: requests of at most 1 MiB, at most `MAX_CALLS` calls at
once, at most `MAX_SLOW_CALLS` slow ones (checkpoints, restores) at once, so
that a flood of them never queues the quick ones (the client retries a busy
answer within its deadline), idle connections closed after a minute, and a
malformed request costs one rate-limited log line.
"""

import concurrent.futures
import json
import threading
import time
import uuid
from typing import Any, Callable, Dict, FrozenSet, Optional

from absl import logging
import grpc

from smart_replay import errors
from smart_replay.control import access as control_access

SERVICE = 'smart_replay.Control'
# A request is a small JSON object; an answer may list a table's items.
MAX_REQUEST_BYTES = 1 << 20
MAX_ANSWER_BYTES = 64 << 20
# Calls served at once, and of those the slow ones; more are refused.
MAX_CALLS = 32
MAX_SLOW_CALLS = 2
_WORKERS = 8
_SERVER_OPTIONS = [
    ('grpc.max_receive_message_length', MAX_REQUEST_BYTES),
    ('grpc.max_send_message_length', MAX_ANSWER_BYTES),
    ('grpc.max_connection_idle_ms', 60_000),
    # gRPC shares a port already in use (SO_REUSEPORT) by default.
    ('grpc.so_reuseport', 0)]
_CLIENT_OPTIONS = [('grpc.max_receive_message_length', MAX_ANSWER_BYTES),
                   ('grpc.max_send_message_length', MAX_REQUEST_BYTES)]
# Seconds between two log lines about refused or malformed calls.
_LOG_EVERY_S = 10.0

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


class _Malformed:
  """A request that is not a JSON object (never raised: grpcio would log a
  traceback for every one)."""

  def __init__(self, why: str):
    self.why = why


def _decode_request(data: bytes) -> Any:
  try:
    request = json.loads(data.decode('utf-8'))
  except (UnicodeDecodeError, ValueError, RecursionError) as e:
    return _Malformed(f'not UTF-8 JSON ({type(e).__name__})')
  if not isinstance(request, dict):
    return _Malformed(f'a JSON {type(request).__name__}, not an object')
  return request


def _decode_answer(data: bytes) -> Dict[str, Any]:
  return json.loads(data.decode('utf-8'))


class _Throttled:
  """Counts events and logs one warning line per `_LOG_EVERY_S` at most."""

  def __init__(self, what: str):
    self._what = what
    self._lock = threading.Lock()
    self._count = 0
    self._last = -float('inf')

  def __call__(self, detail: str) -> None:
    with self._lock:
      self._count += 1
      now = time.monotonic()
      if now - self._last < _LOG_EVERY_S:
        return
      count, self._count, self._last = self._count, 0, now
    logging.warning('Control service: %d %s in the last %g s (latest: %s).',
                    count, self._what, _LOG_EVERY_S, detail)


class ControlServer:
  """Serves `handlers` ({method: fn(request) -> answer}) on a gRPC port.

  A handler's `SmartReplayError`/`ValueError` reaches the client as the same
  error class and message (passed through `redact`); anything else as a
  `RuntimeError` naming only an id that the server's log line carries.

  Args:
    handlers: JSON-in, JSON-out functions by method name.
    port: TCP port to listen on.
    access: where to listen and who may call (`control_access`).
    token: the secret every call must carry; None: no token (only with
      `access.auth` False).
    slow: the methods that may take long (at most `MAX_SLOW_CALLS` at once;
      more are answered `ServerBusyError` at once).
    redact: applied to every answer and error message (e.g. to hide paths
      from callers nobody authenticated); None: none.

  Raises:
    ValueError: if `handlers` is empty or the port cannot be bound.
  """

  def __init__(self, handlers: Dict[str, Handler], *, port: int,
               access: control_access.ControlAccess, token: Optional[str],
               slow: FrozenSet[str] = frozenset(),
               redact: Optional[Callable[[Any], Any]] = None):
    if not handlers:
      raise ValueError('handlers must name at least one method, got {}.')
    if access.auth and not token:
      raise ValueError('the control service needs a token when access.auth '
                       'is True.')
    self._slow, self._redact = slow, redact or (lambda x: x)
    self._slots = threading.BoundedSemaphore(MAX_SLOW_CALLS)
    self._malformed = _Throttled('malformed requests')
    refused = _Throttled('calls refused without a valid token')
    interceptors = ([control_access.TokenInterceptor(
        token, on_refused=refused)] if token else [])
    self._server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(
            _WORKERS, thread_name_prefix='smart_replay_control'),
        interceptors=interceptors, options=_SERVER_OPTIONS,
        maximum_concurrent_rpcs=MAX_CALLS)
    self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        SERVICE, {name: grpc.unary_unary_rpc_method_handler(
            self._wrap(name, fn), request_deserializer=_decode_request,
            response_serializer=_encode) for name, fn in handlers.items()})])
    address = control_access.bind_address(access.host, port)
    credentials = access.server_credentials()
    try:
      self.port = (self._server.add_secure_port(address, credentials)
                   if credentials else self._server.add_insecure_port(address))
    except RuntimeError as e:
      raise ValueError(f'the control service cannot listen on {address} '
                       f'({e}); pass another control port or host.') from e
    if not self.port:
      raise ValueError(f'the control service cannot listen on {address} (in '
                       'use, or not an address of this machine?); pass '
                       'another control port or host.')
    self.host = access.host
    self._server.start()

  def _wrap(self, name: str, fn: Handler):
    def call(request, context):
      del context
      if isinstance(request, _Malformed):
        self._malformed(f'{name}: {request.why}')
        return {'error': {'type': 'ValueError', 'message':
                          f'bad request to {name!r}: {request.why}; send a '
                          'JSON object.'}}
      slow = name in self._slow
      if slow and not self._slots.acquire(blocking=False):
        return {'error': {'type': 'ServerBusyError', 'message':
                          f'{MAX_SLOW_CALLS} slow calls (checkpoints, '
                          f'restores) are running; {name!r} was not '
                          'started. Try again later.'}}
      try:
        return {'result': self._redact(fn(request))}
      except (errors.SmartReplayError, ValueError) as e:
        return {'error': {'type': type(e).__name__,
                          'message': self._redact(str(e))}}
      except Exception as e:  # pylint: disable=broad-except
        incident = uuid.uuid4().hex[:8]  # One line each: the id is findable.
        logging.error('Control service: %r failed (incident %s): %s: %s',
                      name, incident, type(e).__name__, e)
        return {'error': {'type': 'RuntimeError', 'message':
                          f'{name!r} failed inside the server (incident '
                          f'{incident} in its log).'}}
      finally:
        if slow:
          self._slots.release()
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
    credentials: the token and TLS files to present (`ClientCredentials.
      resolve()`); None: none.
  """

  def __init__(self, address: str, *,
               credentials: Optional[
                   control_access.ClientCredentials] = None):
    self.address = address
    self._credentials = credentials or control_access.ClientCredentials()
    tls = self._credentials.channel_credentials
    self._channel = (grpc.secure_channel(address, tls,
                                         options=_CLIENT_OPTIONS)
                     if tls else grpc.insecure_channel(
                         address, options=_CLIENT_OPTIONS))

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
      AuthenticationError: if the server refused the token (or its absence);
        says where this client looked for one.
      ServerBusyError: if the server stayed busy with other slow calls for
        all of `timeout_s`.
      SmartReplayError, ValueError, RuntimeError: what the handler raised,
        with its message; RuntimeError for other gRPC failures.
    """
    deadline = time.monotonic() + timeout_s
    wait = 0.05
    while True:
      try:
        return self._call_once(method, request,
                               max(0.001, deadline - time.monotonic()))
      except errors.ServerBusyError:
        if time.monotonic() + wait > deadline:
          raise
      time.sleep(wait)
      wait = min(2 * wait, 1.0)

  def _call_once(self, method: str, request: Optional[Dict[str, Any]],
                 timeout_s: float) -> Any:
    stub = self._channel.unary_unary(f'/{SERVICE}/{method}',
                                     request_serializer=_encode,
                                     response_deserializer=_decode_answer)
    try:
      answer = stub(request or {}, timeout=timeout_s, wait_for_ready=True,
                    metadata=self._credentials.metadata())
    except grpc.RpcError as e:
      code = e.code()  # pylint: disable=no-member
      if code == grpc.StatusCode.UNAUTHENTICATED:
        raise errors.AuthenticationError(
            f'the smart_replay control service at {self.address} refused '
            f'{method!r}: it needs the token of its server (the file '
            'control.token in the buffer directory, or the one given to '
            'smart-replay-serve --control_token_file). This client looked '
            f'in: {self._credentials.looked}. Pass control_token_file= (or '
            f'set ${control_access.TOKEN_FILE_ENV}) to a copy of it.'
        ) from None
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
