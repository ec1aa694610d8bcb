"""Who may call a buffer server's control service: a token, TLS, loopback.

The control service of `smart-replay-serve` can checkpoint, restore and
describe the buffer, so every call must carry the server's secret token
(gRPC metadata `authorization: Bearer <token>`), checked by
`TokenInterceptor` with `hmac.compare_digest`; a call without it gets
`UNAUTHENTICATED`, from loopback too (other users of a shared host are not
trusted). The server reads its token from a file (mode 0600): the one given,
or `<buffer>/control.token`, created at the first start.

`ControlAccess` is the server's side: the address it binds (loopback unless
told otherwise), the token file, optional TLS or mutual TLS, and protected
mode: a service without a token that would listen beyond loopback refuses to
start unless the operator switches protected mode off. `ClientCredentials` is
a client's side: the token from `RemoteBuffer(control_token_file=...)`, else
the environment (`SMART_REPLAY_CONTROL_TOKEN`, then
`SMART_REPLAY_CONTROL_TOKEN_FILE`), and the TLS files; it remembers where it
looked, for the error a refused call raises.
"""

import dataclasses
import hmac
import ipaddress
import os
import secrets
import stat
from typing import Any, Callable, Optional

from absl import logging
import gin
import grpc

from smart_replay import errors
from smart_replay.storage import durable

TOKEN_ENV = 'SMART_REPLAY_CONTROL_TOKEN'
TOKEN_FILE_ENV = 'SMART_REPLAY_CONTROL_TOKEN_FILE'
TOKEN_FILE_NAME = 'control.token'
LOOPBACK = '127.0.0.1'
_METADATA_KEY = 'authorization'
_SCHEME = 'Bearer '
_MAX_TOKEN_BYTES = 4096


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


def new_token_file(path: str) -> None:
  """Creates a token file with a fresh random secret, mode 0600.

  Args:
    path: the file to create; it must not exist.

  Raises:
    FileExistsError: if it exists.
    OSError: if it cannot be written.
  """
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  with os.fdopen(fd, 'w') as f:
    f.write(secrets.token_urlsafe(32) + '\n')
    f.flush()
    os.fsync(f.fileno())
  durable.fsync_dir(os.path.dirname(os.path.abspath(path)))


def read_token_file(path: str, *, what: str) -> str:
  """Reads a token file, refusing one that others can read.

  Args:
    path: the token file.
    what: where the path came from, for messages (e.g. a flag's name).

  Returns:
    The token (surrounding white space removed).

  Raises:
    AuthenticationError: if the file is missing, empty, too long, or
      readable or writable by group or others (names the path, its mode and
      the fix).
  """
  try:
    mode = os.stat(path).st_mode
    with open(path, 'rb') as f:
      data = f.read(_MAX_TOKEN_BYTES + 1)
  except OSError as e:
    raise errors.AuthenticationError(
        f'cannot read the control token file {path} ({what}): '
        f'{e.strerror or e}.') from None
  if mode & (stat.S_IRWXG | stat.S_IRWXO):
    raise errors.AuthenticationError(
        f'the control token file {path} ({what}) has mode '
        f'{stat.S_IMODE(mode):04o}: group or others can read or change it. '
        f'Run `chmod 600 {path}`.')
  token = data.decode('utf-8', 'replace').strip()
  if not token or len(data) > _MAX_TOKEN_BYTES or any(
      c.isspace() for c in token):
    raise errors.AuthenticationError(
        f'the control token file {path} ({what}) must hold one token of 1 to '
        f'{_MAX_TOKEN_BYTES} bytes without white space, got {len(data)} '
        'bytes.')
  return token


def _check_file(name: str, path: Optional[str]) -> None:
  """Checks an optional file argument."""
  if path is None:
    return
  if not isinstance(path, str) or not os.path.isfile(path):
    raise ValueError(f'{name} must be None or an existing file, got '
                     f'{path!r}.')


def _read(path: Optional[str]) -> Optional[bytes]:
  if path is None:
    return None
  with open(path, 'rb') as f:
    return f.read()


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ControlAccess:
  """Where a server's control service listens and who may call it.

  Attributes:
    host: the address it binds: loopback by default (this machine only);
      an interface's address or '0.0.0.0' / '::' for other machines.
    token_file: the file holding the secret every call must carry; None:
      `<buffer>/control.token`, created (mode 0600) at the first start. A
      file given must exist, readable by its owner only.
    auth: False serves without a token (any local process may call); then
      protected mode refuses a `host` beyond loopback.
    protected_mode: refuse to listen beyond loopback without a token
      (unless mutual TLS authenticates clients); False allows it.
    tls_cert_file: the server's certificate (PEM) to serve TLS; with
      `tls_key_file`.
    tls_key_file: its private key (PEM).
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
      _check_file(f'control {name}', getattr(self, name))
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

  def token_path(self, buffer_dir: str) -> Optional[str]:
    """The token file of a buffer's server (None when `auth` is False).

    Args:
      buffer_dir: the served buffer's directory.

    Returns:
      `token_file`, or `<buffer_dir>/control.token`.
    """
    if not self.auth:
      return None
    return self.token_file or os.path.join(buffer_dir, TOKEN_FILE_NAME)

  def token(self, buffer_dir: str) -> Optional[str]:
    """The token calls must carry, creating the default file if needed.

    Args:
      buffer_dir: the served buffer's directory.

    Returns:
      The token, or None when `auth` is False.

    Raises:
      AuthenticationError: if the token file cannot be read or is open to
        others (names it).
    """
    if not self.auth:
      return None
    if self.token_file is not None:
      return read_token_file(self.token_file, what='control token_file')
    path = os.path.join(buffer_dir, TOKEN_FILE_NAME)
    try:
      os.makedirs(buffer_dir, exist_ok=True)
      new_token_file(path)
      logging.info('Created the control token file %s (mode 0600); clients '
                   'pass it as control_token_file or %s.', path,
                   TOKEN_FILE_ENV)
    except FileExistsError:
      pass
    except OSError as e:
      raise errors.AuthenticationError(
          f'cannot create the control token file {path}: '
          f'{e.strerror or e}.') from None
    return read_token_file(path, what='the buffer\'s default token file')

  def server_credentials(self) -> Optional[grpc.ServerCredentials]:
    """TLS credentials for the port, or None to serve plain TCP."""
    if self.tls_cert_file is None:
      return None
    return grpc.ssl_server_credentials(
        [(_read(self.tls_key_file), _read(self.tls_cert_file))],
        root_certificates=_read(self.tls_client_ca_file),
        require_client_auth=self.tls_client_ca_file is not None)

  def describe(self) -> str:
    """How the service is protected, for the start-up log line."""
    parts = ['token' if self.auth else 'NO TOKEN']
    if self.tls_client_ca_file:
      parts.append('mutual TLS')
    elif self.tls_cert_file:
      parts.append('TLS')
    return ', '.join(parts)


@dataclasses.dataclass(frozen=True)
class ClientCredentials:
  """What a client presents to a control service.

  Build with `resolve`. The token itself is not part of `repr`.

  Attributes:
    token: the secret, or None.
    looked: where the token was taken from, or every place looked in.
    channel_credentials: TLS credentials, or None for plain TCP.
  """
  token: Optional[str] = dataclasses.field(default=None, repr=False)
  looked: str = 'nowhere'
  channel_credentials: Optional[grpc.ChannelCredentials] = None

  @classmethod
  def resolve(cls, *, token_file: Optional[str] = None,
              tls_ca_file: Optional[str] = None,
              tls_cert_file: Optional[str] = None,
              tls_key_file: Optional[str] = None,
              environ: Optional[Any] = None) -> 'ClientCredentials':
    """Finds the token and TLS files a client uses.

    The token comes from `token_file` if given, else from the environment
    variable `SMART_REPLAY_CONTROL_TOKEN` (the token), else from the file
    `SMART_REPLAY_CONTROL_TOKEN_FILE` names; with none of them, calls carry
    no token.

    Args:
      token_file: a token file (e.g. `RemoteBuffer.control_token_file`).
      tls_ca_file: the CA that signed the server's certificate: use TLS.
      tls_cert_file: the client's certificate, for mutual TLS.
      tls_key_file: its private key.
      environ: the environment to read (default `os.environ`).

    Returns:
      The credentials.

    Raises:
      AuthenticationError: if a token file is unreadable or open to others.
      ValueError: if a TLS file is missing, or a certificate comes without
        its key (or the reverse), or without `tls_ca_file`.
    """
    environ = os.environ if environ is None else environ
    for name, path in (('control_tls_ca_file', tls_ca_file),
                       ('control_tls_cert_file', tls_cert_file),
                       ('control_tls_key_file', tls_key_file)):
      _check_file(name, path)
    if (tls_cert_file is None) != (tls_key_file is None) or (
        tls_cert_file and not tls_ca_file):
      raise ValueError(
          'control_tls_cert_file and control_tls_key_file go together, and '
          'with control_tls_ca_file; got '
          f'control_tls_ca_file={tls_ca_file!r}, '
          f'control_tls_cert_file={tls_cert_file!r}, '
          f'control_tls_key_file={tls_key_file!r}.')
    channel = None
    if tls_ca_file is not None:
      channel = grpc.ssl_channel_credentials(
          _read(tls_ca_file), private_key=_read(tls_key_file),
          certificate_chain=_read(tls_cert_file))
    if token_file is not None:
      return cls(read_token_file(token_file, what='control_token_file'),
                 f'control_token_file={token_file}', channel)
    if environ.get(TOKEN_ENV):
      return cls(environ[TOKEN_ENV].strip(), f'${TOKEN_ENV}', channel)
    if environ.get(TOKEN_FILE_ENV):
      path = environ[TOKEN_FILE_ENV]
      return cls(read_token_file(path, what=f'${TOKEN_FILE_ENV}'),
                 f'${TOKEN_FILE_ENV}={path}', channel)
    return cls(None, f'no control_token_file given, ${TOKEN_ENV} and '
               f'${TOKEN_FILE_ENV} not set', channel)

  def metadata(self) -> Optional[Any]:
    """The call metadata carrying the token, or None without one."""
    if self.token is None:
      return None
    return ((_METADATA_KEY, _SCHEME + self.token),)


def _refuse(request: Any, context: grpc.ServicerContext) -> None:
  del request
  context.abort(grpc.StatusCode.UNAUTHENTICATED,
                'this call carries no valid control token')


class TokenInterceptor(grpc.ServerInterceptor):
  """Answers `UNAUTHENTICATED` to every call without the token.

  Args:
    token: the secret every call must carry.
    on_refused: called with the method's name after each refusal (e.g. to
      count and log them).
  """

  def __init__(self, token: str, *,
               on_refused: Optional[Callable[[str], None]] = None):
    self._expected = (_SCHEME + token).encode('utf-8')
    self._on_refused = on_refused
    self._refusal = grpc.unary_unary_rpc_method_handler(_refuse)

  def intercept_service(self, continuation, handler_call_details):
    """Passes authenticated calls on; refuses the others.

    Args:
      continuation: gives the method's handler.
      handler_call_details: the method and its metadata.

    Returns:
      The method's handler, or one that refuses the call.
    """
    given = b''
    for key, value in handler_call_details.invocation_metadata or ():
      if key == _METADATA_KEY:
        given = value.encode('utf-8', 'replace') if isinstance(
            value, str) else bytes(value)
    if hmac.compare_digest(given, self._expected):
      return continuation(handler_call_details)
    if self._on_refused is not None:
      self._on_refused(handler_call_details.method)
    return self._refusal
