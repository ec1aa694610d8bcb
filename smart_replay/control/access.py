"""Who may call a buffer server's control service, and how it proves itself.

The control service of `smart-replay-serve` can checkpoint, restore and
describe the buffer, so every call must carry one of the server's tokens
(gRPC metadata `authorization: Bearer <token>`), checked by
`TokenInterceptor` in constant time before the request's body is read: the
operator token for every method, the reader token for those that only read
(`protocol.READ_ONLY_METHODS`). A call without one gets `UNAUTHENTICATED`,
from loopback too (other users of a shared host are not trusted).

A client must also know it talks to the buffer's own server before it sends
a token, so a server with tokens always serves TLS: with the certificate
files its operator gives, else with its own certificate (`certificates`),
written into the token files clients hold (`tokens`).

`ControlAccess` is the server's side: the address it binds (loopback
unless told otherwise), the token file, TLS or mutual TLS, and protected
mode (a service without a token that would listen beyond loopback refuses
to start unless the operator switches protected mode off). `secrets()`
gives what a server needs to serve: its tokens, their files and its TLS
credentials. A client's side is `credentials.ClientCredentials`.
"""

import dataclasses
import hmac
import ipaddress
import os
from typing import Callable, Collection, Optional, Tuple

from absl import logging
import gin
import grpc

from smart_replay import errors
from smart_replay.control import certificates
from smart_replay.control import private_files
from smart_replay.control import protocol
from smart_replay.control import tokens
from smart_replay.storage import ownership

LOOPBACK = protocol.LOOPBACK


def is_loopback(host: str) -> bool:
  """Whether `host` names this machine only (127.0.0.0/8, ::1, localhost).

  Args:
    host: an address (IPv6 may be in brackets) or host name; names other
      than 'localhost' are not resolved (pass the address they resolve to).

  Returns:
    True for loopback addresses (IPv4-mapped too: '::ffff:127.0.0.1') and
    'localhost'; False for anything else, including the wildcards '0.0.0.0'
    and '::'.
  """
  if host == 'localhost':
    return True
  try:
    ip = ipaddress.ip_address(host.strip('[]'))
  except ValueError:
    return False
  mapped = getattr(ip, 'ipv4_mapped', None)  # ::ffff:127.0.0.1
  return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def bind_address(host: str, port: int) -> str:
  """'host:port' for gRPC, an IPv6 address in brackets.

  Args:
    host: an address or host name.
    port: the TCP port.

  Returns:
    The address to bind or dial.
  """
  if ':' in host and not host.startswith('['):
    host = f'[{host}]'
  return f'{host}:{port}'


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ControlAccess:
  """Where a server's control service listens and who may call it.

  Attributes:
    host: the address it binds: loopback by default (this machine only);
      an interface's address or '0.0.0.0' / '::' for other machines.
    token_file: a file holding the operator token (e.g. one shared by the
      shards of a sharded buffer); None: the server's own, made at the
      first start. A file given must exist, be its user's own and readable
      by nobody else. Either way the server writes the token, with its
      certificate, to `<buffer>/control.token` for clients.
    auth: False serves without a token (any local process may call); then
      protected mode refuses a `host` beyond loopback.
    protected_mode: refuse to listen beyond loopback without a token
      (unless mutual TLS authenticates clients); False allows it.
    tls_cert_file: the server's certificate (PEM) to serve TLS with, in
      place of its own; with `tls_key_file`. A file made by
      `certificates.write_identity` (both in one file) can serve several
      servers, and its clients pin it as they pin a server's own.
    tls_key_file: its private key (PEM, not encrypted).
    tls_client_ca_file: require client certificates signed by this CA
      (mutual TLS); needs the two above.

  Raises:
    ValueError: if a field is invalid (names it and its value), or the
      service would listen beyond loopback without authentication while
      protected mode is on.
  """
  host: str = LOOPBACK
  token_file: Optional[str] = None
  auth: bool = True
  protected_mode: bool = True
  tls_cert_file: Optional[str] = None
  tls_key_file: Optional[str] = None
  tls_client_ca_file: Optional[str] = None

  def __post_init__(self):
    if not isinstance(self.host, str) or not self.host:
      raise ValueError(f'control host must be an address, got {self.host!r}.')
    for name in ('tls_cert_file', 'tls_key_file', 'tls_client_ca_file'):
      certificates.check_tls_file(f'control {name}', getattr(self, name))
    if (self.tls_cert_file is None) != (self.tls_key_file is None):
      raise ValueError(
          'control tls_cert_file and tls_key_file go together, got '
          f'tls_cert_file={self.tls_cert_file!r}, '
          f'tls_key_file={self.tls_key_file!r}.')
    if self.tls_client_ca_file and not self.tls_cert_file:
      raise ValueError(
          f'control tls_client_ca_file={self.tls_client_ca_file!r} needs '
          'tls_cert_file and tls_key_file (mutual TLS is TLS).')
    if self.token_file is not None and not isinstance(self.token_file, str):
      raise ValueError(f'control token_file must be None or a path, got '
                       f'{self.token_file!r}.')
    if (not self.auth and self.protected_mode and not is_loopback(self.host)
        and not self.tls_client_ca_file):
      raise ValueError(
          f'protected mode: the control service would listen on '
          f'{self.host!r}, beyond loopback, without a token: anyone who can '
          'reach it could checkpoint, restore and read this buffer. Keep the '
          'token (drop --nocontrol_auth), require client certificates '
          '(--control_tls_client_ca_file), bind loopback, or switch '
          'protected mode off (--noprotected_mode) on a network you trust.')

  def secrets(self, buffer_dir: str) -> 'ServerSecrets':
    """What the server needs to serve: its tokens, their files, its TLS.

    With tokens (`auth`) the service always serves TLS: with the files
    given, else with the server's own certificate (`certificates`), made
    at the first start. The buffer folder then holds `control.token` (the
    operator token: `token_file`'s if given, else its own, made once) and
    `reader.token`, each with that certificate, for clients to copy.

    Args:
      buffer_dir: the served buffer's folder (made, mode 0700, if missing;
        refused unless this user's own, `ownership.own_buffer_dir`).

    Returns:
      The server's secrets.

    Raises:
      UnsafeBufferDirError: if another user could change the folder.
      AuthenticationError: if a token or key file cannot be made or read,
        or is not safe to trust (a link, another user's, open to others;
        names it and the fix).
      ValueError: if the certificate files given do not hold a certificate
        and its key.
    """
    # Made 0700 and checked to be this user's own before a file in it is
    # read or written.
    ownership.own_buffer_dir(buffer_dir)
    credentials, certificate = self._tls(buffer_dir)
    if not self.auth:
      return ServerSecrets(credentials=credentials)
    given = None
    if self.token_file is not None:
      given = tokens.read_token_file(self.token_file,
                                     what='control token_file').token
    operator_file = os.path.join(buffer_dir, tokens.OPERATOR_FILE_NAME)
    reader_file = os.path.join(buffer_dir, tokens.READER_FILE_NAME)
    existed = os.path.lexists(operator_file)
    operator = tokens.keep_token_file(operator_file, token=given,
                                      certificate=certificate)
    reader = tokens.keep_token_file(reader_file, token=None,
                                    certificate=certificate)
    if reader.token == operator.token:  # Only if someone copied one over.
      raise errors.AuthenticationError(
          f'{reader_file} holds the operator token of {operator_file}; '
          f'remove {reader_file} (the server makes a new reader token).')
    if not existed:
      logging.info('Created the control token files %s (operator) and %s '
                   '(reader), mode 0600; clients pass a copy as '
                   'control_token_file.', operator_file, reader_file)
    return ServerSecrets(
        operator_token=operator.token, reader_token=reader.token,
        operator_file=operator_file, reader_file=reader_file,
        credentials=credentials,
        fingerprint=certificates.fingerprint(certificate)
        if certificate else None)

  def _tls(self, buffer_dir: str) -> Tuple[
      Optional[grpc.ServerCredentials], Optional[bytes]]:
    """The port's TLS credentials, and the certificate clients pin (the
    server's own, or a shared one made by `certificates.write_identity`;
    None for a CA's)."""
    if self.tls_cert_file is not None:
      chain = certificates.split_certificates(
          certificates.read_tls_file(self.tls_cert_file))[1]
      key = certificates.split_certificates(private_files.read_private_file(
          self.tls_key_file, what='control tls_key_file'))[0]
      if not chain:
        raise ValueError(f'control tls_cert_file={self.tls_cert_file!r} '
                         'holds no PEM certificate.')
      certificates.check_pair(
          chain[0], key, what=f'control tls_cert_file={self.tls_cert_file!r}'
          f' and tls_key_file={self.tls_key_file!r}')
      credentials = grpc.ssl_server_credentials(
          [(key.strip() + b'\n', b''.join(chain))],
          root_certificates=certificates.read_tls_file(
              self.tls_client_ca_file),
          require_client_auth=self.tls_client_ca_file is not None)
      own = len(chain) == 1 and certificates.is_own(chain[0])
      return credentials, chain[0] if own else None
    if self.auth:
      certificate, key = certificates.own_certificate(buffer_dir)
      return grpc.ssl_server_credentials([(key, certificate)]), certificate
    return None, None

  def describe(self, fingerprint: Optional[str] = None) -> str:
    """How the service is protected, for the start-up log line.

    Args:
      fingerprint: the server's own certificate's fingerprint, if it has
        one.

    Returns:
      E.g. 'operator and reader tokens, TLS (own certificate SHA256:...)'.
    """
    parts = ['operator and reader tokens' if self.auth else 'NO TOKEN']
    if self.tls_client_ca_file:
      parts.append('mutual TLS')
    elif self.tls_cert_file:
      parts.append('TLS')
    elif fingerprint:
      parts.append(f'TLS (own certificate {fingerprint})')
    return ', '.join(parts)


@dataclasses.dataclass(frozen=True)
class ServerSecrets:
  """What a control server holds (`ControlAccess.secrets`).

  Attributes:
    operator_token: the token of every method; None: no tokens.
    reader_token: the token of the read-only methods and the metrics.
    operator_file: the buffer's `control.token`, for clients.
    reader_file: the buffer's `reader.token`.
    credentials: TLS credentials of the port, or None for plain TCP (only
      without tokens).
    fingerprint: the server's own certificate's fingerprint, or None.
  """
  operator_token: Optional[str] = dataclasses.field(default=None, repr=False)
  reader_token: Optional[str] = dataclasses.field(default=None, repr=False)
  operator_file: Optional[str] = None
  reader_file: Optional[str] = None
  credentials: Optional[grpc.ServerCredentials] = None
  fingerprint: Optional[str] = None


def _refuse(request_iterator, context: grpc.ServicerContext) -> None:
  del request_iterator  # Never read: a body that never comes holds nothing.
  context.abort(grpc.StatusCode.UNAUTHENTICATED,
                'this call carries no valid control token')


def _refuse_scope(request_iterator, context: grpc.ServicerContext) -> None:
  del request_iterator
  context.abort(grpc.StatusCode.PERMISSION_DENIED,
                'the reader token may call only the methods that read; this '
                'one needs the operator token (control.token)')


class TokenInterceptor(grpc.ServerInterceptor):
  """Refuses every call without a token valid for its method.

  Refusals answer at once, without reading the request (a call whose body
  never comes holds no worker): `UNAUTHENTICATED` without a valid token,
  `PERMISSION_DENIED` for the reader token on a method that changes the
  buffer.

  Args:
    operator_token: the token of every method.
    reader_token: the token of `read_only` methods, or None.
    read_only: the methods the reader token may call.
    on_refused: called with the method's name after each refusal (e.g. to
      count and log them).
  """

  def __init__(self, operator_token: str, *,
               reader_token: Optional[str] = None,
               read_only: Collection[str] = protocol.READ_ONLY_METHODS,
               on_refused: Optional[Callable[[str], None]] = None):
    self._operator = (protocol.SCHEME + operator_token).encode('utf-8')
    self._reader = ((protocol.SCHEME + reader_token).encode('utf-8')
                    if reader_token else None)
    self._read_only = frozenset(
        f'/{protocol.SERVICE}/{name}' for name in read_only)
    self._on_refused = on_refused
    self._refusal = grpc.stream_unary_rpc_method_handler(_refuse)
    self._scope_refusal = grpc.stream_unary_rpc_method_handler(_refuse_scope)

  def intercept_service(self, continuation, handler_call_details):
    """Passes calls with a valid token on; refuses the others.

    Args:
      continuation: gives the method's handler.
      handler_call_details: the method and its metadata.

    Returns:
      The method's handler, or one that refuses the call.
    """
    given = b''
    for key, value in handler_call_details.invocation_metadata or ():
      if key == protocol.METADATA_KEY:
        given = value.encode('utf-8', 'replace') if isinstance(
            value, str) else bytes(value)
    # Both comparisons always run, in constant time.
    operator = hmac.compare_digest(given, self._operator)
    reader = self._reader is not None and hmac.compare_digest(
        given, self._reader)
    if operator:
      return continuation(handler_call_details)
    if reader and handler_call_details.method in self._read_only:
      return continuation(handler_call_details)
    if self._on_refused is not None:
      self._on_refused(handler_call_details.method)
    return self._scope_refusal if reader else self._refusal
