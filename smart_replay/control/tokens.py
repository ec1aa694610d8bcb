"""Token files: the secret a control call carries, and the server it goes to.

A token file holds one token (one line, no white space) and, when the
server makes its own TLS certificate (`certificates`), that certificate
after it (PEM): what a client needs to send its token to the buffer's own
server only. A server keeps two, in its buffer folder:

* `control.token`, the **operator** token: every method, including those
  that change the buffer (checkpoints, restores);
* `reader.token`, the **reader** token: the methods that only read
  (`protocol.READ_ONLY_METHODS`) and the metrics endpoint, so a monitoring
  credential cannot roll a buffer back.

Files are created and read as `private_files` says (mode 0600, the user's
own, no links followed).
"""

import dataclasses
import os
import secrets
from typing import Optional, Tuple

from smart_replay import errors
from smart_replay.control import certificates
from smart_replay.control import private_files

OPERATOR_FILE_NAME = 'control.token'
READER_FILE_NAME = 'reader.token'
_MAX_TOKEN_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class TokenFile:
  """What a token file holds.

  Attributes:
    token: the secret (not part of `repr`).
    certificate: the server's own certificate (PEM) to pin, or None when the
      server uses certificate files its operator gave (clients then name
      their CA) or serves without TLS.
  """
  token: str = dataclasses.field(repr=False)
  certificate: Optional[bytes] = None

  def encode(self) -> bytes:
    """The file's bytes: the token's line, then the certificate."""
    return (self.token + '\n').encode('utf-8') + (self.certificate or b'')


def new_token() -> str:
  """A fresh random token (256 bits, URL-safe text)."""
  return secrets.token_urlsafe(32)


def new_token_file(path: str, *,
                   certificate: Optional[bytes] = None) -> TokenFile:
  """Creates a token file with a fresh token, mode 0600.

  Args:
    path: the file to create; it must not exist.
    certificate: the server certificate to write after the token, or None.

  Returns:
    What it holds.

  Raises:
    FileExistsError: if it exists.
    OSError: if it cannot be written.
  """
  content = TokenFile(new_token(), certificate)
  private_files.write_private_file(path, content.encode())
  return content


def read_token_file(path: str, *, what: str) -> TokenFile:
  """Reads a token file, refusing one that is not safe to trust.

  Args:
    path: the token file.
    what: where the path came from, for messages (e.g. a flag's name).

  Returns:
    Its token and certificate.

  Raises:
    AuthenticationError: if the file is missing, a link, another user's,
      readable or writable by group or others, or does not hold one token
      of 1 to 4096 bytes (and at most one certificate); names the path, what
      is wrong and the fix.
  """
  try:
    data = private_files.read_private_file(
        path, what=f'the control token file ({what})')
  except FileNotFoundError:
    raise errors.AuthenticationError(
        f'cannot read the control token file {path} ({what}): no such '
        'file.') from None
  rest, found = certificates.split_certificates(data)
  token = rest.decode('utf-8', 'replace').strip()
  if (not token or len(token) > _MAX_TOKEN_BYTES or len(found) > 1 or
      any(c.isspace() for c in token)):
    raise errors.AuthenticationError(
        f'the control token file {path} ({what}) must hold one token of 1 to '
        f'{_MAX_TOKEN_BYTES} bytes without white space, then at most one '
        f'certificate; got {len(rest)} bytes of token text and '
        f'{len(found)} certificate(s).')
  return TokenFile(token, found[0] if found else None)


def keep_token_file(path: str, *, token: Optional[str],
                    certificate: Optional[bytes]) -> TokenFile:
  """Makes a server's own token file hold `token` and `certificate`.

  An existing file keeps its token unless `token` is given; it is written
  again (at once, `private_files`) only when what it holds differs, e.g.
  after the server made a new certificate.

  Args:
    path: a token file in the server's buffer folder.
    token: the token it must hold; None: the file's own, or a new one.
    certificate: the certificate it must hold, or None.

  Returns:
    What the file holds.

  Raises:
    AuthenticationError: if an existing file is not safe to trust (see
      `read_token_file`) or cannot be written.
  """
  try:
    held = read_token_file(path, what='the server\'s own')
  except errors.AuthenticationError:
    if os.path.lexists(path):
      raise
    held = None
  wanted = TokenFile(token or (held.token if held else new_token()),
                     certificate)
  if held != wanted:
    try:
      private_files.write_private_file(path, wanted.encode(),
                                       replace=held is not None)
    except OSError as e:
      raise errors.AuthenticationError(
          f'cannot write the control token file {path}: '
          f'{e.strerror or e}.') from None
  return wanted


def new_shared_control_credentials(folder: str) -> Tuple[str, str]:
  """Makes the control credentials several servers share (the shards of a
  sharded buffer): one operator token and one server identity.

  Serve every shard with `smart-replay-serve --control_token_file=TOKEN
  --control_tls_cert_file=IDENTITY --control_tls_key_file=IDENTITY` (or
  `ControlAccess(token_file=..., tls_cert_file=..., tls_key_file=...)`);
  clients use the token file, which carries the shared certificate.

  Args:
    folder: an existing folder of the user's own; `shared.token` and
      `shared.pem` must not exist in it yet.

  Returns:
    (the token file, the identity file: key and certificate), mode 0600.

  Raises:
    FileExistsError: if either file exists.
  """
  token_file = os.path.join(folder, 'shared.token')
  identity_file = os.path.join(folder, 'shared.pem')
  if os.path.lexists(token_file):
    raise FileExistsError(f'{token_file} exists; use it, or remove it and '
                          f'{identity_file} first.')
  certificate = certificates.write_identity(identity_file)
  new_token_file(token_file, certificate=certificate)
  return token_file, identity_file
