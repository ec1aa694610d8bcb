"""A hardened HTTP(S) server for one WSGI app, in a daemon thread.

`serve` checks its arguments, then serves the app until `Endpoint.close`.
It binds to 127.0.0.1 unless told otherwise. Bound to any other address it
needs authentication (protected mode): a bearer token (`token`: every request
must carry `Authorization: Bearer <token>`, compared in constant time, or
gets a 401) or client certificates (`tls_client_ca_file`: mutual TLS),
unless `allow_unauthenticated_remote=True`. `tls_cert_file` and
`tls_key_file` serve HTTPS (TLS 1.2 or later; an encrypted key is refused
rather than prompted for). Every connection has `timeout_s` for its TLS
handshake, run in the connection's own thread, and then `timeout_s` to send
its whole request, so slow or half-sent requests do not pile up threads.
Requests are not logged.

Connections are capped: at most `max_connections` (16 by default) are served
at once, each by its own thread, and at most `max_connections_per_peer` (4)
from one client address (IPv6: one /64). A connection beyond either cap is
closed as soon as it is accepted, before a thread starts or a TLS handshake
begins; refusals are counted (`Endpoint.refused_connections`) and logged in
one warning line per 10 s at most. So a flood of connections costs at most
`max_connections` threads and sockets, whatever its size, and the rest of
the process (other ports, checkpoints) keeps its file descriptors. What the
caps cannot promise is a slot for a legitimate client: a flood from fewer
than `max_connections / max_connections_per_peer` addresses, none of them the
client's, leaves it slots; a flood from the client's own address (e.g.
another user of the same machine, on 127.0.0.1), or from enough addresses
(any local user can connect from every 127.0.0.0/8 address), can take every
slot, each for up to `timeout_s` (twice that over TLS), so that clients are
refused until it stops. Keep such peers off the port (a firewall rule, e.g.
nftables' `meta skuid` on one machine).
"""

import errno
import hmac
import io
import ipaddress
import math
import os
import socket
import ssl
import sys
import threading
import time
from typing import Any, Callable, Iterable, Optional, Union
from wsgiref import simple_server

from absl import logging
from prometheus_client import exposition

from smart_replay.control import access as control_access
from smart_replay.utils import throttled_log

_PathLike = Union[str, 'os.PathLike[str]']
_App = Callable[..., Iterable[bytes]]

# Connections served at once, and from one client address, by default.
MAX_CONNECTIONS = 16
MAX_CONNECTIONS_PER_PEER = 4

# At most one warning line about refused connections per this many seconds.
_LOG_EVERY_S = 10.0


class _EncryptedKeyError(Exception):
  """Raised by the password callback: an encrypted key is not supported."""


def _no_password() -> bytes:
  # Without a callback OpenSSL would prompt for the key's password on the
  # terminal, and a server's start would hang there.
  raise _EncryptedKeyError()


def _require_bearer(app: _App, token: str, name: str) -> _App:
  """Wraps a WSGI app: requests without `Bearer <token>` get a 401."""
  expected = token.encode('utf-8')
  unauthorized = (f'401 Unauthorized: this {name} endpoint needs the header '
                  '"Authorization: Bearer <token>".\n').encode('utf-8')

  def guarded(environ: dict, start_response: Callable) -> Iterable[bytes]:
    scheme, _, credentials = environ.get('HTTP_AUTHORIZATION', '').partition(
        ' ')
    # WSGI gives headers as latin-1 strings: this recovers the bytes sent.
    given = credentials.strip(' ').encode('latin-1', 'replace')
    matches = hmac.compare_digest(given, expected)  # Constant time.
    if matches and scheme.lower() == 'bearer':
      return app(environ, start_response)
    start_response('401 Unauthorized', [
        ('Content-Type', 'text/plain; charset=utf-8'),
        ('Content-Length', str(len(unauthorized))),
        ('WWW-Authenticate', 'Bearer')])
    return [unauthorized]

  return guarded


class _DeadlineReader(io.RawIOBase):
  """Reads a socket until a deadline: a request must arrive in time.

  A socket timeout alone bounds each read, so a client sending one byte per
  timeout could hold its thread for ever; this bounds them all together.
  """

  def __init__(self, connection: socket.socket, timeout_s: float):
    super().__init__()
    self._connection = connection
    self._timeout_s = timeout_s
    self._deadline = time.monotonic() + timeout_s

  def readable(self) -> bool:
    return True

  def readinto(self, buffer: Any) -> int:
    remaining = self._deadline - time.monotonic()
    if remaining <= 0:
      raise TimeoutError(f'the request was not received within timeout_s='
                         f'{self._timeout_s} s.')
    self._connection.settimeout(remaining)
    try:
      return self._connection.recv_into(buffer)
    finally:  # Writing the response has the full timeout again.
      self._connection.settimeout(self._timeout_s)


def peer_key(host: str) -> str:
  """The client address that `max_connections_per_peer` counts.

  Args:
    host: a client's address as `accept` gives it, e.g. '10.0.0.7', '::1',
      '::ffff:10.0.0.7' or 'fe80::1%eth0'.

  Returns:
    The IPv4 address (of an IPv4-mapped IPv6 one too); for other IPv6
    addresses their /64 network (a site usually has a whole /64, so its
    addresses count as one peer), except the loopback '::1'; `host` itself
    when it is not an IP address.
  """
  try:
    address = ipaddress.ip_address(host.partition('%')[0])
  except ValueError:
    return host
  if address.version == 6:
    if address.ipv4_mapped is not None:
      return str(address.ipv4_mapped)
    if not address.is_loopback:
      return str(ipaddress.ip_network((address, 64), strict=False))
  return str(address)


class _Handler(simple_server.WSGIRequestHandler):
  """Serves one request: silent (as prometheus_client's), with a deadline."""

  def setup(self) -> None:
    super().setup()
    self.rfile.close()
    self.rfile = io.BufferedReader(_DeadlineReader(
        self.connection, self.server.connection_timeout_s))

  def log_message(self, *args: Any) -> None:
    del args  # No log line per request.


class _Server(exposition.ThreadingWSGIServer):
  """prometheus_client's threading WSGI server, with timeouts, caps and TLS.

  One daemon thread per connection (as prometheus_client's), for at most
  `max_connections` connections at once and `max_per_peer` per client
  address: the serving thread closes any other connection right after
  accepting it (`verify_request`). Each connection gets a socket timeout,
  and its TLS handshake runs in its own thread.
  """

  # socketserver's default backlog, 5, drops the SYNs of a burst of
  # connections: their clients (a scrape among them) wait seconds to retry.
  request_queue_size = 128

  def __init__(self, address: tuple, family: int, timeout_s: float,
               tls_context: Optional[ssl.SSLContext], name: str,
               max_connections: int, max_per_peer: int):
    self.address_family = family
    self.connection_timeout_s = timeout_s
    self._tls_context = tls_context
    self._name = name
    self._slots = threading.BoundedSemaphore(max_connections)
    self._max_connections = max_connections
    self._max_per_peer = max_per_peer
    self._lock = threading.Lock()  # Guards _open.
    self._open = {}  # Open connections by peer_key.
    self.refusals = throttled_log.ThrottledWarning(
        f'{name.capitalize()} endpoint: refused {{count}} connection(s) '
        '({total} since it started; at most one such line per {every_s:g} '
        f's): it serves at most {max_connections} at once and '
        f'{max_per_peer} per client address. The latest: {{latest}}.',
        every_s=_LOG_EVERY_S)
    super().__init__(address, _Handler)

  def get_request(self) -> tuple:
    connection, address = self.socket.accept()
    connection.settimeout(self.connection_timeout_s)
    return connection, address

  def verify_request(self, request: Any, client_address: Any) -> bool:
    """Takes a slot for the connection, or refuses it (it is then closed)."""
    peer = peer_key(client_address[0])
    with self._lock:
      held = self._open.get(peer, 0)
      admitted = (held < self._max_per_peer and
                  self._slots.acquire(blocking=False))
      if admitted:
        self._open[peer] = held + 1
    if not admitted:
      self.refusals(
          f'{peer}, which had {held} open' if held >= self._max_per_peer
          else f'{peer}, while all {self._max_connections} were open')
    return admitted

  def _release(self, client_address: Any) -> None:
    peer = peer_key(client_address[0])
    with self._lock:
      held = self._open[peer] - 1
      if held:
        self._open[peer] = held
      else:
        del self._open[peer]
      self._slots.release()

  def process_request(self, request: Any, client_address: Any) -> None:
    try:  # Starts the connection's thread, which gives its slot back ...
      super().process_request(request, client_address)
    except BaseException:  # ... unless it could not start.
      self._release(client_address)
      raise

  def process_request_thread(self, request: Any, client_address: Any
                             ) -> None:
    try:
      super().process_request_thread(request, client_address)
    finally:  # The connection is closed by now.
      self._release(client_address)

  def service_actions(self) -> None:
    # Runs in the serving thread at least every 0.5 s: logs the last
    # refusals of a flood that has stopped.
    super().service_actions()
    self.refusals.flush()

  def finish_request(self, request: Any, client_address: Any) -> None:
    if self._tls_context is None:
      super().finish_request(request, client_address)
      return
    # Not a TLS listening socket: its accept() would run the handshake in
    # the serving thread, where one silent client would block all others.
    # Here the handshake runs under the connection's timeout.
    connection = self._tls_context.wrap_socket(request, server_side=True)
    try:
      super().finish_request(connection, client_address)
    finally:
      self.shutdown_request(connection)

  def handle_error(self, request: Any, client_address: Any) -> None:
    error = sys.exc_info()[1]
    if isinstance(error, OSError):  # Timeouts, resets, failed handshakes.
      logging.debug('%s endpoint: connection from %s dropped: %r',
                    self._name.capitalize(), client_address, error)
      return
    super().handle_error(request, client_address)


def _check_token(token: Any) -> None:
  """Checks a bearer token; errors describe it without showing it."""
  if token is None:
    return
  if not isinstance(token, str) or not token:
    shown = ('an empty string' if isinstance(token, str)
             else f'a {type(token).__name__}')
    raise ValueError('token must be a non-empty string (the secret of '
                     f'"Authorization: Bearer <token>"), got {shown}.')
  bad = [i for i, c in enumerate(token)
         if c.isspace() or not c.isprintable()]
  if bad:
    raise ValueError(
        f'token must not contain whitespace or control characters (an HTTP '
        f'header cannot carry them), got a {len(token)}-character string '
        f'(not shown: it is a secret) with one at index {bad[0]}; strip a '
        'token read from a file.')


def _file_argument(name: str, value: Any) -> Optional[str]:
  """Checks that an optional file argument names an existing file."""
  if value is None:
    return None
  if not isinstance(value, (str, os.PathLike)):
    raise ValueError(f'{name} must be a path (str or os.PathLike), got '
                     f'{value!r}.')
  path = os.fspath(value)
  if not os.path.isfile(path):
    raise ValueError(f'{name} {path!r} does not exist or is not a file; '
                     'expected a PEM file.')
  return path


def _tls_context(cert_file: str, key_file: str,
                 client_ca_file: Optional[str]) -> ssl.SSLContext:
  """The server's TLS context (client certificates required with a CA)."""
  context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  context.minimum_version = ssl.TLSVersion.TLSv1_2
  try:
    context.load_cert_chain(cert_file, key_file, password=_no_password)
  except _EncryptedKeyError:
    raise ValueError(f'tls_key_file {key_file!r} is encrypted; expected an '
                     'unencrypted PEM private key (readable only by the '
                     'serving user).') from None
  except OSError as e:  # ssl.SSLError included.
    raise ValueError(
        f'tls_cert_file {cert_file!r} and tls_key_file {key_file!r} could '
        f'not be loaded ({e}); expected a PEM certificate (chain) and its '
        'PEM private key.') from e
  if client_ca_file is not None:
    try:
      context.load_verify_locations(cafile=client_ca_file)
    except OSError as e:
      raise ValueError(
          f'tls_client_ca_file {client_ca_file!r} could not be loaded ({e}); '
          'expected the PEM certificate(s) of the CA that signs client '
          'certificates.') from e
    context.verify_mode = ssl.CERT_REQUIRED
  return context


class Endpoint:
  """A WSGI app being served (returned by `serve`).

  Attributes:
    port: the port it listens on.
    scheme: 'https' with TLS, else 'http'.
  """

  def __init__(self, httpd: _Server, host: str, scheme: str, name: str):
    self._httpd = httpd
    self._host = host
    self.scheme = scheme
    self._thread = threading.Thread(
        target=httpd.serve_forever, name=f'smart_replay-{name}', daemon=True)
    self._thread.start()
    self._closed = False

  @property
  def port(self) -> int:
    """The port it listens on."""
    return self._httpd.server_port

  @property
  def refused_connections(self) -> int:
    """Connections refused for a cap (see `serve`) since serving began."""
    return self._httpd.refusals.total

  def url(self, path: str) -> str:
    """A URL of the app on the host it was bound to.

    Args:
      path: the URL's path, e.g. '/metrics'.

    Returns:
      e.g. `http://127.0.0.1:9090/metrics` (https with TLS; an IPv6 host in
      brackets).
    """
    host = f'[{self._host}]' if ':' in self._host else self._host
    return f'{self.scheme}://{host}:{self.port}{path}'

  def close(self) -> None:
    """Stops serving and waits for the serving thread (safe to call twice)."""
    if self._closed:
      return
    self._closed = True
    self._httpd.shutdown()
    self._httpd.server_close()
    self._thread.join(timeout=10)


def serve(app: _App, *, name: str, port: int, host: str = '127.0.0.1',
          token: Optional[str] = None,
          tls_cert_file: Optional[_PathLike] = None,
          tls_key_file: Optional[_PathLike] = None,
          tls_client_ca_file: Optional[_PathLike] = None,
          allow_unauthenticated_remote: bool = False,
          timeout_s: float = 10.0, token_hint: str = '',
          max_connections: int = MAX_CONNECTIONS,
          max_connections_per_peer: int = MAX_CONNECTIONS_PER_PEER
          ) -> Endpoint:
  """Serves a WSGI app over HTTP(S) in a daemon thread, hardened.

  Args:
    app: the WSGI app.
    name: what is served, one word (e.g. 'metrics'): messages say "the
      <name> endpoint" and call the port `<name>_port`; the serving thread
      is `smart_replay-<name>`.
    port: the TCP port; 0 picks a free one.
    host: the address or name to bind (127.0.0.1: this machine only;
      '0.0.0.0' for other machines, which needs `token` or
      `tls_client_ca_file`, see `allow_unauthenticated_remote`).
    token: a shared secret; when given, every request must carry the header
      `Authorization: Bearer <token>` or gets a 401.
    tls_cert_file: a PEM certificate (chain) to serve HTTPS; goes with
      `tls_key_file`.
    tls_key_file: the certificate's unencrypted PEM private key.
    tls_client_ca_file: PEM certificate(s) of a CA; when given, clients must
      present a certificate it signed (mutual TLS). Needs `tls_cert_file`.
    allow_unauthenticated_remote: serve on a non-loopback `host` with
      neither `token` nor `tls_client_ca_file` (anyone who can reach the
      port gets the app), logging a warning.
    timeout_s: seconds a connection has for its TLS handshake, then for
      sending its whole request, and for each write of the response; a
      slower or half-sent request is dropped and its thread ends.
    token_hint: how clients send the token (e.g. a client's setting), put in
      parentheses after `token` in the protected-mode error; '' for none.
    max_connections: connections served at once (one thread each); more
      are closed as soon as they are accepted, before any TLS handshake.
    max_connections_per_peer: connections served at once from one client
      address (`peer_key`: IPv6 per /64), at most `max_connections`; more
      are closed the same way, so that one address cannot take every slot.

  Returns:
    The running endpoint: its port and URLs; `close()` stops it.

  Raises:
    ValueError: if an argument is invalid (named): `port` out of range or
      already in use, a `host` that does not resolve to a local address, an
      empty `token` or one with whitespace, only one of `tls_cert_file` /
      `tls_key_file`, a missing, unloadable or encrypted TLS file, a
      non-positive `timeout_s`, a `max_connections` or
      `max_connections_per_peer` that is not a positive integer, or a
      `max_connections_per_peer` above `max_connections`; or a non-loopback
      `host` without authentication (protected mode).
  """
  port_name = f'{name}_port'
  if isinstance(port, bool) or not isinstance(port, int) or not (
      0 <= port <= 65535):
    raise ValueError(f'{port_name} must be an integer in [0, 65535], got '
                     f'{port!r}.')
  if not isinstance(host, str) or not host:
    raise ValueError(f'host must be a non-empty string (an address or '
                     f'name to bind, e.g. 127.0.0.1), got {host!r}.')
  if (isinstance(timeout_s, bool) or
      not isinstance(timeout_s, (int, float)) or
      not math.isfinite(timeout_s) or timeout_s <= 0):
    raise ValueError(f'timeout_s must be a positive number of seconds, '
                     f'got {timeout_s!r}.')
  for what, cap in (('max_connections', max_connections),
                    ('max_connections_per_peer', max_connections_per_peer)):
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
      raise ValueError(f'{what} must be a positive integer (connections '
                       f'served at once), got {cap!r}.')
  if max_connections_per_peer > max_connections:
    raise ValueError(
        f'max_connections_per_peer must be at most max_connections='
        f'{max_connections}, got {max_connections_per_peer!r}.')
  _check_token(token)
  cert_file = _file_argument('tls_cert_file', tls_cert_file)
  key_file = _file_argument('tls_key_file', tls_key_file)
  client_ca_file = _file_argument('tls_client_ca_file', tls_client_ca_file)
  if (cert_file is None) != (key_file is None):
    raise ValueError(
        'tls_cert_file and tls_key_file go together (HTTPS needs both), '
        f'got tls_cert_file={cert_file!r} and tls_key_file={key_file!r}.')
  if client_ca_file is not None and cert_file is None:
    raise ValueError(
        f'tls_client_ca_file={client_ca_file!r} needs tls_cert_file and '
        'tls_key_file too (client certificates are checked over HTTPS), '
        'got neither.')
  try:
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
  except socket.gaierror as e:
    raise ValueError(f'host {host!r} does not resolve ({e}); expected an '
                     'address or name of this machine, e.g. 127.0.0.1.'
                     ) from e
  authenticated = token is not None or client_ca_file is not None
  if not authenticated and not control_access.is_loopback(sockaddr[0]):
    if not allow_unauthenticated_remote:
      hint = f' ({token_hint})' if token_hint else ''
      raise ValueError(
          f'host {host!r} is not a loopback address, so the {name} '
          'endpoint would be reachable from other machines, and token is '
          f'None: pass token=<a shared secret>{hint}, or '
          'tls_client_ca_file (with tls_cert_file and tls_key_file) to '
          'require client certificates, or allow_unauthenticated_remote='
          'True to serve it to anyone who can reach the port.')
    logging.warning('SECURITY: the %s endpoint on %s:%s has no '
                    'authentication (allow_unauthenticated_remote=True).',
                    name, host, port)
  tls = (None if cert_file is None else
         _tls_context(cert_file, key_file, client_ca_file))
  if token is not None:
    app = _require_bearer(app, token, name)
  try:
    httpd = _Server((sockaddr[0], port), family, float(timeout_s), tls, name,
                    max_connections, max_connections_per_peer)
  except OSError as e:
    if e.errno == errno.EADDRINUSE:
      raise ValueError(f'{port_name} {port} on {host} is already in use; '
                       'pass another port, or 0 to pick a free one.') from e
    if e.errno == errno.EADDRNOTAVAIL:
      raise ValueError(f'host {host!r} is not an address of this machine '
                       f'({e}); expected a local address, e.g. '
                       '127.0.0.1 or 0.0.0.0.') from e
    raise
  httpd.set_app(app)
  return Endpoint(httpd, host, 'http' if tls is None else 'https', name)
