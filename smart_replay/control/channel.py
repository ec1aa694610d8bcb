"""The control service of a standalone buffer server, and its client.

Reverb's gRPC port carries the data; what Reverb cannot do remotely (describe
the buffer's configuration, write a verified checkpoint with a manifest, read
per-item sample counts, coordinated checkpoints) goes through this small gRPC
service (`protocol` names its methods), served by the same process on its
own port (by default the Reverb port + 1). Requests and answers are JSON
objects; every call has a deadline, and an error raised by the server is
raised again on the client as the same `smart_replay.errors` class with the
server's message.

Unlike Reverb's port, this one can be kept safe (`access`): it binds
loopback unless told otherwise, serves TLS whenever it asks for tokens, and
every call must carry a token valid for its method, checked before its body
is read. Everything is bounded:

* a request of at most 1 MiB; a call must ask for a deadline of at most
  `protocol.MAX_CALL_S` (refused otherwise, before its body is read);
* at most `MAX_CALLS` calls at once on `_WORKERS` threads; slow calls
  (checkpoints, restores) run `MAX_SLOW_CALLS` at a time, first come first
  served, with at most `MAX_WAITING_SLOW_CALLS` waiting (more are answered
  `ServerBusyError`, which the client retries with jitter within its
  deadline), so they never hold the workers the quick calls need;
* connections: `MAX_CONNECTIONS` at once, a TLS handshake within
  `HANDSHAKE_TIMEOUT_S` (a silent TCP connection is closed then), idle ones
  closed after `IDLE_CONNECTION_S`, and none older than
  `MAX_CONNECTION_AGE_S` (calls in progress get `protocol.MAX_CALL_S` more);
* a malformed request or a refused call costs one rate-limited log line,
  with the method name escaped.
"""

import collections
import concurrent.futures
import json
import random
import threading
import time
import uuid
from typing import Any, Callable, Dict, Optional

from absl import logging
import grpc

from smart_replay import errors
from smart_replay.control import access as control_access
from smart_replay.control import credentials as credentials_lib
from smart_replay.control import protocol
from smart_replay.utils import throttled_log

# Calls served at once, and of those the slow ones; more are refused.
MAX_CALLS = 32
MAX_SLOW_CALLS = 2
MAX_WAITING_SLOW_CALLS = 4
_WORKERS = 16
MAX_CONNECTIONS = 256
HANDSHAKE_TIMEOUT_S = 10
IDLE_CONNECTION_S = 60
MAX_CONNECTION_AGE_S = 3600
_SERVER_OPTIONS = [
    ('grpc.max_receive_message_length', protocol.MAX_REQUEST_BYTES),
    ('grpc.max_send_message_length', protocol.MAX_ANSWER_BYTES),
    ('grpc.server_handshake_timeout_ms', HANDSHAKE_TIMEOUT_S * 1000),
    ('grpc.max_connection_idle_ms', IDLE_CONNECTION_S * 1000),
    ('grpc.max_connection_age_ms', MAX_CONNECTION_AGE_S * 1000),
    ('grpc.max_connection_age_grace_ms', int(protocol.MAX_CALL_S * 1000)),
    ('grpc.max_allowed_incoming_connections', MAX_CONNECTIONS),
    # gRPC shares a port already in use (SO_REUSEPORT) by default.
    ('grpc.so_reuseport', 0)]
_CLIENT_OPTIONS = [
    ('grpc.max_receive_message_length', protocol.MAX_ANSWER_BYTES),
    ('grpc.max_send_message_length', protocol.MAX_REQUEST_BYTES)]
# Seconds between two log lines about refused or malformed calls, and the
# line (the method name escaped: `!r`).
_LOG_EVERY_S = 10.0
_FLOOD_LINE = ('Control service: {count} {what} in the last {every_s:g} s '
               '(latest: {latest!r}).')

Handler = Callable[[Dict[str, Any]], Dict[str, Any]]


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


class _SlowCalls:
  """Admits slow calls `running` at a time, first come first served.

  At most `waiting` calls wait for their turn; a call that finds the queue
  full, or whose deadline passes while it waits, is not started.
  """

  def __init__(self, running: int, waiting: int):
    self._running, self._max_running = 0, running
    self._max_waiting = waiting
    self._queue = collections.deque()
    self._changed = threading.Condition()

  def enter(self, timeout_s: float) -> Optional[str]:
    """Waits for this call's turn; None once admitted, else why not."""
    deadline = time.monotonic() + timeout_s
    with self._changed:
      if len(self._queue) >= self._max_waiting:
        return (f'{self._max_running} slow calls (checkpoints, restores) are '
                f'running and {len(self._queue)} are waiting')
      ticket = object()
      self._queue.append(ticket)
      while not (self._queue[0] is ticket and
                 self._running < self._max_running):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
          self._queue.remove(ticket)
          self._changed.notify_all()
          return (f'its deadline passed while {self._max_running} slow '
                  'calls ran before it')
        self._changed.wait(remaining)
      self._queue.popleft()
      self._running += 1
      self._changed.notify_all()
    return None

  def leave(self) -> None:
    """Ends an admitted call: the next in line may start."""
    with self._changed:
      self._running -= 1
      self._changed.notify_all()


class ControlServer:
  """Serves `handlers` ({method: fn(request) -> answer}) on a gRPC port.

  A handler's `SmartReplayError`/`ValueError` reaches the client as the same
  error class and message (passed through `redact`); anything else as a
  `RuntimeError` naming only an id that the server's log line carries.

  Args:
    handlers: JSON-in, JSON-out functions by method name (`protocol`).
    port: TCP port to listen on.
    access: where to listen and who may call (`access.ControlAccess`).
    secrets: the tokens and TLS credentials (`ControlAccess.secrets()`).
    redact: applied to every answer and error message (e.g. to hide paths
      from callers nobody authenticated); None: none.

  Raises:
    ValueError: if `handlers` is empty or names a method the protocol does
      not have, or the port cannot be bound.
  """

  def __init__(self, handlers: Dict[str, Handler], *, port: int,
               access: control_access.ControlAccess,
               secrets: control_access.ServerSecrets,
               redact: Optional[Callable[[Any], Any]] = None):
    if not handlers or not set(handlers) <= protocol.METHODS:
      raise ValueError(f'handlers must name methods of '
                       f'{sorted(protocol.METHODS)}, got {sorted(handlers)}.')
    if access.auth and not secrets.operator_token:
      raise ValueError('the control service needs its tokens when '
                       'access.auth is True.')
    self._redact = redact or (lambda x: x)
    self._slow_calls = _SlowCalls(MAX_SLOW_CALLS, MAX_WAITING_SLOW_CALLS)
    self._malformed = throttled_log.ThrottledWarning(
        _FLOOD_LINE.replace('{what}', 'malformed requests'),
        every_s=_LOG_EVERY_S)
    refused = throttled_log.ThrottledWarning(
        _FLOOD_LINE.replace('{what}', 'calls refused without a valid token'),
        every_s=_LOG_EVERY_S)
    interceptors = ([control_access.TokenInterceptor(
        secrets.operator_token, reader_token=secrets.reader_token,
        on_refused=refused)] if secrets.operator_token else [])
    self._server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(
            _WORKERS, thread_name_prefix='smart_replay_control'),
        interceptors=interceptors, options=_SERVER_OPTIONS,
        maximum_concurrent_rpcs=MAX_CALLS)
    self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        protocol.SERVICE, {name: grpc.stream_unary_rpc_method_handler(
            self._wrap(name, fn), request_deserializer=_decode_request,
            response_serializer=_encode) for name, fn in handlers.items()})])
    address = control_access.bind_address(access.host, port)
    try:
      self.port = (self._server.add_secure_port(address, secrets.credentials)
                   if secrets.credentials else
                   self._server.add_insecure_port(address))
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
    slow = name in protocol.SLOW_METHODS

    def call(requests, context):
      remaining = context.time_remaining()
      if remaining is None or remaining > protocol.MAX_CALL_S + 1:
        # Refused before its body is read: nothing waits for it.
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f'a call to {name!r} must have a deadline of at most '
                      f'{protocol.MAX_CALL_S:g} s')
      request = next(requests, None)
      if request is None:
        return {'error': {'type': 'ValueError', 'message':
                          f'the call to {name!r} sent no request.'}}
      if isinstance(request, _Malformed):
        self._malformed(f'{name}: {request.why}')
        return {'error': {'type': 'ValueError', 'message':
                          f'bad request to {name!r}: {request.why}; send a '
                          'JSON object.'}}
      if slow:
        refused = self._slow_calls.enter(context.time_remaining() or 0.0)
        if refused is not None:
          return {'error': {'type': 'ServerBusyError', 'message':
                            f'{name!r} was not started: {refused}. Try '
                            'again later.'}}
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
          self._slow_calls.leave()
    return call

  def stop(self, grace_s: float = 5.0) -> None:
    """Stops serving; calls in progress get some time to finish.

    Args:
      grace_s: seconds the calls in progress get.
    """
    self._server.stop(grace_s).wait(grace_s + 1)


# What gRPC's details say when the TLS handshake failed, and why.
_TLS_FAILURES = (
    ('CERTIFICATE_VERIFY_FAILED', 'its certificate is not one this client '
     'trusts'),
    ('WRONG_VERSION_NUMBER', 'it does not speak TLS (a server without '
     'tokens serves plain TCP; or another program listens there)'),
    ('Ssl handshake failed', 'the TLS handshake failed'),
)


class ControlClient:
  """Calls a `ControlServer` at `address` ('host:port'), with deadlines.

  Args:
    address: the control service's 'host:port' ('localhost' is dialled as
      127.0.0.1, `protocol.dial_address`).
    credentials: the token and what to check the server with
      (`ClientCredentials.resolve()`); None: none (plain TCP, no token).
  """

  def __init__(self, address: str, *,
               credentials: Optional[
                   credentials_lib.ClientCredentials] = None):
    self.address = protocol.dial_address(address)
    self._credentials = credentials or credentials_lib.ClientCredentials()
    tls = self._credentials.channel_credentials
    options = _CLIENT_OPTIONS + list(self._credentials.channel_options)
    self._channel = (grpc.secure_channel(self.address, tls, options=options)
                     if tls else grpc.insecure_channel(self.address,
                                                       options=options))
    # A client without TLS first checks, once, that the server does not
    # close its connections at once (it serves TLS: it wants a token).
    self._checked = tls is not None

  def call(self, method: str, request: Optional[Dict[str, Any]] = None, *,
           timeout_s: float) -> Any:
    """Calls `method` and returns its answer.

    Args:
      method: the method's name (`protocol`), e.g. `protocol.INFO`.
      request: its JSON-serializable arguments.
      timeout_s: the deadline of the call, in seconds; a longer one than
        `protocol.MAX_CALL_S` (the longest a server accepts) is cut to it.

    Returns:
      The handler's JSON answer.

    Raises:
      ValueError: if `method` is not a method of the protocol, or
        `timeout_s` is not positive.
      ServerUnavailableError: if no answer came within `timeout_s`.
      AuthenticationError: if the server refused the token (or its absence),
        or did not prove it is the buffer's server; says where this client
        looked and what it trusts.
      ServerBusyError: if the server stayed busy with other slow calls for
        all of `timeout_s`.
      SmartReplayError, ValueError, RuntimeError: what the handler raised,
        with its message; RuntimeError for other gRPC failures.
    """
    if method not in protocol.METHODS:
      raise ValueError(f'method must be one of {sorted(protocol.METHODS)}, '
                       f'got {method!r}.')
    if not timeout_s > 0:
      raise ValueError(f'timeout_s must be positive, got {timeout_s!r}.')
    timeout_s = min(timeout_s, protocol.MAX_CALL_S)
    deadline = time.monotonic() + timeout_s
    if not self._checked:
      self._check_plain(timeout_s)
    wait = 0.05
    while True:
      try:
        return self._call_once(method, request,
                               max(0.001, deadline - time.monotonic()))
      except errors.ServerBusyError:
        if time.monotonic() + wait > deadline:
          raise
      # Jitter: clients retrying at once do not collide again.
      time.sleep(wait * random.uniform(0.5, 1.0))
      wait = min(2 * wait, 1.0)

  def _check_plain(self, timeout_s: float) -> None:
    """Raises at once if a server closes this plain client's connections
    (a server with tokens serves TLS); a server that is down is waited for
    by the call itself."""
    stub = self._channel.unary_unary(f'/{protocol.SERVICE}/{protocol.INFO}',
                                     request_serializer=_encode,
                                     response_deserializer=_decode_answer)
    try:
      stub({}, timeout=min(2.0, timeout_s), wait_for_ready=False)
    except grpc.RpcError as e:
      if 'Socket closed' in (e.details() or ''):  # pylint: disable=no-member
        raise self._error(protocol.INFO, timeout_s, e) from None
    self._checked = True

  def _call_once(self, method: str, request: Optional[Dict[str, Any]],
                 timeout_s: float) -> Any:
    stub = self._channel.unary_unary(f'/{protocol.SERVICE}/{method}',
                                     request_serializer=_encode,
                                     response_deserializer=_decode_answer)
    try:
      answer = stub(request or {}, timeout=timeout_s, wait_for_ready=True,
                    metadata=self._credentials.metadata())
    except grpc.RpcError as e:
      raise self._error(method, timeout_s, e, stub) from None
    if 'error' in answer:
      kind = getattr(errors, answer['error']['type'], None)
      if not (isinstance(kind, type) and issubclass(kind, Exception)):
        kind = ValueError if answer['error']['type'] == 'ValueError' else \
            RuntimeError
      raise kind(f'(from the server at {self.address}) '
                 f"{answer['error']['message']}")
    return answer['result']

  def _error(self, method: str, timeout_s: float, e: grpc.RpcError,
             stub: Optional[Any] = None) -> Exception:
    """The error a failed call raises; `stub`: the call's, if it waited for
    the channel (then one call that does not wait says why it never
    connected: a failed TLS handshake, a closed connection)."""
    code = e.code()  # pylint: disable=no-member
    details = e.details() or ''  # pylint: disable=no-member
    unreachable = code in (grpc.StatusCode.DEADLINE_EXCEEDED,
                           grpc.StatusCode.UNAVAILABLE)
    if unreachable and stub is not None:
      try:
        stub({}, timeout=1.0, wait_for_ready=False)  # Carries no token.
      except grpc.RpcError as probe:
        details += ' ' + (probe.details() or '')  # pylint: disable=no-member
    tls = self._credentials.channel_credentials is not None
    where = f'the smart_replay control service at {self.address}'
    if code == grpc.StatusCode.UNAUTHENTICATED:
      return errors.AuthenticationError(
          f'{where} refused {method!r}: it needs a token of its server (a '
          'copy of control.token, or reader.token for the methods that '
          'read, from its buffer folder). This client looked in: '
          f'{self._credentials.looked}. Pass control_token_file= (or set '
          f'${credentials_lib.TOKEN_FILE_ENV}).')
    if code == grpc.StatusCode.PERMISSION_DENIED:
      return errors.AuthenticationError(
          f'{where} refused {method!r}: {details}. This client\'s token '
          f'came from {self._credentials.looked}.')
    for marker, why in _TLS_FAILURES:
      if marker in details:
        return errors.AuthenticationError(
            f'{where} did not prove it is the buffer\'s server ({why}), so '
            f'{method!r} was not sent. This client trusts '
            f'{self._credentials.trusts}. If the server made a new '
            'certificate (its control.pem was removed), copy its '
            'control.token again; otherwise another program may be '
            'listening on that port.')
    if tls and code == grpc.StatusCode.UNAVAILABLE and (
        'Socket closed' in details):
      return errors.ServerUnavailableError(
          f'{where} closed the connection during the TLS handshake of '
          f'{method!r}: it may not speak TLS (a server started with '
          '--nocontrol_auth serves plain TCP), or it is overloaded.')
    if not tls and unreachable and 'Socket closed' in details:
      # Without TLS, a server that asks for tokens (it serves TLS) closes
      # every connection: this is what a client without a token sees.
      return errors.AuthenticationError(
          f'{where} closed the connection of {method!r} at once: it '
          'serves TLS, as a server that asks for tokens does, and this '
          'client has no token to send (it looked in: '
          f'{self._credentials.looked}). Pass control_token_file= (a '
          'copy of the server\'s control.token, which carries its '
          f'certificate) or set ${credentials_lib.TOKEN_FILE_ENV}.')
    if unreachable:
      return errors.ServerUnavailableError(
          f'{where} did not answer {method!r} within {timeout_s:g} s '
          f'({code.name}): it is not reachable (is smart-replay-serve '
          'running, and its control port open from here?), or still '
          'working on a long request (a large checkpoint).')
    return RuntimeError(f'{where} failed on {method!r}: {code.name} '
                        f'{details}')

  def close(self) -> None:
    """Closes the channel; safe to call more than once."""
    self._channel.close()
