"""The client of a smart_replay control service (`server`).

`ControlClient` calls a method (`protocol`) with a deadline, waiting for a
server that restarts; a server's error is raised again as the same
`smart_replay.errors` class with the server's message, and a call that
fails says why in the user's terms: no or a wrong token, a server that did
not prove itself (TLS), one that is not reachable. A busy answer is retried
with jitter within the deadline.
"""

import random
import time
from typing import Any, Dict, Optional

import grpc

from smart_replay import errors
from smart_replay.control import credentials as credentials_lib
from smart_replay.control import protocol

_CLIENT_OPTIONS = [
    ('grpc.max_receive_message_length', protocol.MAX_ANSWER_BYTES),
    ('grpc.max_send_message_length', protocol.MAX_REQUEST_BYTES)]

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
                                     request_serializer=protocol.encode,
                                     response_deserializer=protocol.decode)
    try:
      stub({}, timeout=min(2.0, timeout_s), wait_for_ready=False)
    except grpc.RpcError as e:
      if 'Socket closed' in (e.details() or ''):  # pylint: disable=no-member
        raise self._error(protocol.INFO, timeout_s, e) from None
    self._checked = True

  def _call_once(self, method: str, request: Optional[Dict[str, Any]],
                 timeout_s: float) -> Any:
    stub = self._channel.unary_unary(f'/{protocol.SERVICE}/{method}',
                                     request_serializer=protocol.encode,
                                     response_deserializer=protocol.decode)
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
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and (
        'Concurrent RPC limit' in details):  # Refused unread: retried.
      return errors.ServerBusyError(
          f'{where} was serving its most calls at once and did not start '
          f'{method!r}. Try again later.')
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
