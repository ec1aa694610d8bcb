"""What a client presents to a control service, and whom it trusts.

`ClientCredentials.resolve` finds the token: `control_token_file=` (e.g. a
copy of the server's `control.token` or `reader.token`), else the
environment (`SMART_REPLAY_CONTROL_TOKEN`, the token itself, then
`SMART_REPLAY_CONTROL_TOKEN_FILE`, a file). It also decides which server
the client trusts: the CA file given (`control_tls_ca_file`), else the
certificate the token file carries (`tokens`). A token is never sent
without TLS to a server so authenticated: a client with a token and
nothing to check the server with refuses to start, naming what it lacks.
It remembers where it looked, for the error a refused call raises.
"""

import dataclasses
import os
from typing import Any, Optional, Tuple

import grpc

from smart_replay import errors
from smart_replay.control import certificates
from smart_replay.control import protocol
from smart_replay.control import tokens

TOKEN_ENV = 'SMART_REPLAY_CONTROL_TOKEN'
TOKEN_FILE_ENV = 'SMART_REPLAY_CONTROL_TOKEN_FILE'


@dataclasses.dataclass(frozen=True)
class ClientCredentials:
  """What a client presents to a control service.

  Build with `resolve`. The token itself is not part of `repr`.

  Attributes:
    token: the secret, or None.
    looked: where the token was taken from, or every place looked in.
    channel_credentials: TLS credentials, or None for plain TCP (only
      without a token).
    channel_options: gRPC channel options TLS needs (the name a server's
      own certificate carries, `certificates.channel_options`).
    trusts: what the client checks the server with, for messages.
  """
  token: Optional[str] = dataclasses.field(default=None, repr=False)
  looked: str = 'nowhere'
  channel_credentials: Optional[grpc.ChannelCredentials] = None
  channel_options: Tuple[Tuple[str, str], ...] = ()
  trusts: str = 'nothing (plain TCP)'

  @classmethod
  def resolve(cls, *, token_file: Optional[str] = None,
              tls_ca_file: Optional[str] = None,
              tls_cert_file: Optional[str] = None,
              tls_key_file: Optional[str] = None,
              environ: Optional[Any] = None) -> 'ClientCredentials':
    """Finds the token and what to check the server with.

    The token comes from `token_file` if given, else from the environment
    variable `SMART_REPLAY_CONTROL_TOKEN` (the token), else from the file
    `SMART_REPLAY_CONTROL_TOKEN_FILE` names; with none of them, calls carry
    no token. The server is checked with `tls_ca_file` if given, else with
    the certificate the token file carries.

    Args:
      token_file: a token file (e.g. `RemoteBuffer.control_token_file`).
      tls_ca_file: the CA that signed the server's certificate (or the
        server's own certificate).
      tls_cert_file: the client's certificate, for mutual TLS.
      tls_key_file: its private key.
      environ: the environment to read (default `os.environ`).

    Returns:
      The credentials.

    Raises:
      AuthenticationError: if a token file is unusable (a link, another
        user's, open to others), or there is a token and nothing to check
        the server with (it would go to whoever answers).
      ValueError: if a TLS file is missing, or a certificate comes without
        its key (or the reverse), or without `tls_ca_file`.
    """
    environ = os.environ if environ is None else environ
    for name, path in (('control_tls_ca_file', tls_ca_file),
                       ('control_tls_cert_file', tls_cert_file),
                       ('control_tls_key_file', tls_key_file)):
      certificates.check_tls_file(name, path)
    if (tls_cert_file is None) != (tls_key_file is None) or (
        tls_cert_file and not tls_ca_file):
      raise ValueError(
          'control_tls_cert_file and control_tls_key_file go together, and '
          f'with control_tls_ca_file; got control_tls_ca_file={tls_ca_file!r}'
          f', control_tls_cert_file={tls_cert_file!r}, '
          f'control_tls_key_file={tls_key_file!r}.')
    held, looked = None, None
    if token_file is not None:
      held = tokens.read_token_file(token_file, what='control_token_file')
      looked = f'control_token_file={token_file}'
    elif environ.get(TOKEN_ENV):
      held = tokens.TokenFile(environ[TOKEN_ENV].strip())
      looked = f'${TOKEN_ENV}'
    elif environ.get(TOKEN_FILE_ENV):
      path = environ[TOKEN_FILE_ENV]
      held = tokens.read_token_file(path, what=f'${TOKEN_FILE_ENV}')
      looked = f'${TOKEN_FILE_ENV}={path}'
    if tls_ca_file is not None:
      root = certificates.read_tls_file(tls_ca_file)
      trusts = f'control_tls_ca_file={tls_ca_file}'
    elif held is not None and held.certificate is not None:
      root = held.certificate
      trusts = (f'the certificate in {looked} '
                f'({certificates.fingerprint(root)})')
    else:
      root, trusts = None, 'nothing (plain TCP)'
    if held is not None and root is None:
      raise errors.AuthenticationError(
          f'refusing to send the control token from {looked} without TLS: '
          'nothing tells this client that it reaches the buffer\'s own '
          'server, and whoever answered would get the token. Use a copy of '
          f'the server\'s {tokens.OPERATOR_FILE_NAME} (or '
          f'{tokens.READER_FILE_NAME}) from its buffer folder, which carries '
          'the server\'s certificate, or pass control_tls_ca_file= (the CA '
          'of the server\'s --control_tls_cert_file).')
    channel = None
    if root is not None:
      channel = grpc.ssl_channel_credentials(
          root, private_key=certificates.read_tls_file(tls_key_file),
          certificate_chain=certificates.read_tls_file(tls_cert_file))
    options = tuple(certificates.channel_options(root))
    if held is None:
      return cls(None, f'no control_token_file given, ${TOKEN_ENV} and '
                 f'${TOKEN_FILE_ENV} not set', channel, options, trusts)
    return cls(held.token, looked, channel, options, trusts)

  def metadata(self) -> Optional[Any]:
    """The call metadata carrying the token, or None without one."""
    if self.token is None:
      return None
    return ((protocol.METADATA_KEY, protocol.SCHEME + self.token),)
