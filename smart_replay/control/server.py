"""The control service of a standalone buffer server (its client: `client`).

Reverb's gRPC port carries the data; what Reverb cannot do remotely (describe
the buffer's configuration, write a verified checkpoint with a manifest, read
per-item sample counts, coordinated checkpoints) goes through this small gRPC
service (`protocol` names its methods and encodes its JSON objects), served
by the same process on its own port (by default the Reverb port + 1). A
handler's error reaches the client as the same `smart_replay.errors` class
with the server's message.

Unlike Reverb's port, this one can be kept safe (`access`): it binds
loopback unless told otherwise, serves TLS whenever it asks for tokens, and
every call must carry a token valid for its method, checked before its body
is read. Everything is bounded:

* a request of at most 1 MiB; a call must ask for a deadline of at most
  `protocol.MAX_CALL_S` (refused otherwise, before its body is read);
* at most `MAX_CALLS` calls at once on `_WORKERS` threads; slow calls
  (checkpoints, restores) run `MAX_SLOW_CALLS` at a time, first come first
  served, with at most `MAX_WAITING_SLOW_CALLS` waiting (more are answered
  `ServerBusyError`, which `client` retries with jitter within its
  deadline), so they never hold the workers the quick calls need;
* connections: `MAX_CONNECTIONS` at once (and
  `protocol.MAX_CONNECTIONS_PER_PEER` per peer where the process runs with
  the bind-address library, which keeps that cap as it accepts them: gRPC
  core has only the total), a TLS handshake within
  `HANDSHAKE_TIMEOUT_S` (a silent TCP connection is closed then), idle ones
  closed after `IDLE_CONNECTION_S`, and none older than
  `MAX_CONNECTION_AGE_S` (calls in progress get `protocol.MAX_CALL_S` more);
* a malformed request or a refused call costs one rate-limited log line,
  with the method name escaped.
"""

import collections
import concurrent.futures
import threading
import time
import uuid
from typing import Any, Callable, Dict, Optional

from absl import logging
import grpc

from smart_replay import errors
from smart_replay.control import access as control_access
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
# Seconds between two log lines about refused or malformed calls, and the
# line (the method name escaped: `!r`).
_LOG_EVERY_S = 10.0
_FLOOD_LINE = ('Control service: {count} {what} in the last {every_s:g} s '
               '(latest: {latest!r}).')

Handler = Callable[[Dict[str, Any]], Dict[str, Any]]


class _Malformed:
  """A request that is not a JSON object (never raised: grpcio would log a
  traceback for every one)."""

  def __init__(self, why: str):
    self.why = why


def _decode_request(data: bytes) -> Any:
  try:
    request = protocol.decode(data)
  except (UnicodeDecodeError, ValueError, RecursionError) as e:
    return _Malformed(f'not UTF-8 JSON ({type(e).__name__})')
  if not isinstance(request, dict):
    return _Malformed(f'a JSON {type(request).__name__}, not an object')
  return request


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
            response_serializer=protocol.encode)
                           for name, fn in handlers.items()})])
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
