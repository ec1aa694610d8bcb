"""The control service's own TLS certificate: made at first start, pinned.

A client must know it reaches the buffer's own server before it sends the
server's token: a bearer token sent to whoever answers a port (another user
listening on `[::1]` or on the port of a restarting server) is stolen. So a
server that asks for a token always serves TLS. Unless the operator gives
certificate files, the server makes a self-signed certificate for itself
at its first start (an EC P-256 key, valid `VALID_DAYS`), keeps it with its
key in `<buffer>/control.pem` (mode 0600), and writes the certificate into
the token file (`token_files`). A client holding the token file trusts
that one certificate and nothing else, so it completes a TLS handshake (and
sends its token) with the buffer's own server only, whatever address it
dials and whoever listens there.

The certificate names `SERVER_NAME`, not a host: a client that pins it
checks that name (`channel_options`), so the same certificate serves every
address of the machine.
"""

import datetime
import os
from typing import List, Optional, Tuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import oid

from smart_replay import errors
from smart_replay.control import private_files

SERVER_NAME = 'smart-replay-control'
FILE_NAME = 'control.pem'
VALID_DAYS = 3650
_BEGIN = b'-----BEGIN CERTIFICATE-----'
_END = b'-----END CERTIFICATE-----'


def check_tls_file(name: str, path: Optional[str]) -> None:
  """Checks an optional TLS file argument (a certificate, key or CA).

  Args:
    name: the argument's name, for the message.
    path: its value.

  Raises:
    ValueError: if it is given and not an existing file (names both).
  """
  if path is None:
    return
  if not isinstance(path, str) or not os.path.isfile(path):
    raise ValueError(f'{name} must be None or an existing file, got '
                     f'{path!r}.')


def read_tls_file(path: Optional[str]) -> Optional[bytes]:
  """The bytes of an optional TLS file (None for None)."""
  if path is None:
    return None
  with open(path, 'rb') as f:
    return f.read()


def new_certificate() -> Tuple[bytes, bytes]:
  """A fresh self-signed certificate for `SERVER_NAME` and its key.

  Returns:
    (certificate, private key), both PEM.
  """
  key = ec.generate_private_key(ec.SECP256R1())
  name = x509.Name([x509.NameAttribute(oid.NameOID.COMMON_NAME, SERVER_NAME)])
  now = datetime.datetime.now(datetime.timezone.utc)
  certificate = (
      x509.CertificateBuilder().subject_name(name).issuer_name(name)
      .public_key(key.public_key())
      .serial_number(x509.random_serial_number())
      .not_valid_before(now - datetime.timedelta(minutes=5))
      .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
      .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]),
                     critical=False)
      .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                     critical=True)
      .sign(key, hashes.SHA256()))
  return (certificate.public_bytes(serialization.Encoding.PEM),
          key.private_bytes(serialization.Encoding.PEM,
                            serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()))


def split_certificates(data: bytes) -> Tuple[bytes, List[bytes]]:
  """Splits PEM text into what is not a certificate and the certificates.

  Args:
    data: text holding zero or more PEM certificates.

  Returns:
    (the rest of the text, [each certificate's PEM block]).
  """
  rest, found = b'', []
  while True:
    start = data.find(_BEGIN)
    end = data.find(_END, start)
    if start < 0 or end < 0:
      return rest + data, found
    end += len(_END)
    rest += data[:start]
    found.append(data[start:end] + b'\n')
    data = data[end:]


def is_own(certificate: bytes) -> bool:
  """Whether a PEM certificate is one a smart_replay server made itself.

  Args:
    certificate: one PEM certificate.

  Returns:
    True if it is self-signed for `SERVER_NAME` (a client pinning it checks
    that name, `channel_options`).
  """
  try:
    parsed = x509.load_pem_x509_certificate(certificate)
  except ValueError:
    return False
  names = parsed.subject.get_attributes_for_oid(oid.NameOID.COMMON_NAME)
  return parsed.subject == parsed.issuer and [n.value for n in names] == [
      SERVER_NAME]


def fingerprint(certificate: bytes) -> str:
  """The SHA-256 fingerprint of a PEM certificate, for messages and logs.

  Args:
    certificate: one PEM certificate.

  Returns:
    'SHA256:' and the hex digest, in pairs joined by ':' (as `openssl x509
    -fingerprint -sha256` prints it, in lower case).
  """
  digest = x509.load_pem_x509_certificate(certificate).fingerprint(
      hashes.SHA256()).hex()
  return 'SHA256:' + ':'.join(digest[i:i + 2] for i in range(0, 64, 2))


def channel_options(certificate: Optional[bytes]) -> List[Tuple[str, str]]:
  """The gRPC channel options a client needs to check a server's name.

  Args:
    certificate: the certificate the client trusts (PEM), or None.

  Returns:
    The name to check in place of the dialled host when `certificate` is a
    smart_replay server's own (it names `SERVER_NAME`, not a host); else no
    options.
  """
  found = split_certificates(certificate or b'')[1]
  if found and all(is_own(c) for c in found):
    return [('grpc.ssl_target_name_override', SERVER_NAME)]
  return []


def write_identity(path: str) -> bytes:
  """Makes a server identity several servers can share (e.g. the shards of
  a sharded buffer): a new key and certificate in one file (mode 0600).

  Serve with `ControlAccess(tls_cert_file=path, tls_key_file=path)` (and
  one shared `token_file`); each server's `control.token` then carries this
  certificate, so one token file reaches every shard.

  Args:
    path: the file to create; it must not exist.

  Returns:
    The certificate (PEM), for token files (`tokens.new_token_file`).

  Raises:
    FileExistsError: if `path` exists.
  """
  certificate, key = new_certificate()
  private_files.write_private_file(path, key + certificate)
  return certificate


def check_pair(certificate: bytes, key: bytes, *, what: str) -> None:
  """Checks that a private key belongs to a certificate.

  Args:
    certificate: the first PEM certificate of a chain.
    key: a PEM private key.
    what: where they came from, for the message.

  Raises:
    ValueError: if either cannot be read, or the key is not the
      certificate's (names `what`).
  """
  try:
    public = x509.load_pem_x509_certificate(certificate).public_key()
    private = serialization.load_pem_private_key(key, password=None)
  except (ValueError, TypeError) as e:
    raise ValueError(f'{what}: cannot read the certificate and its key as '
                     f'PEM ({e}); an encrypted key is not supported.') from None
  encoding = (serialization.Encoding.DER,
              serialization.PublicFormat.SubjectPublicKeyInfo)
  if public.public_bytes(*encoding) != private.public_key().public_bytes(
      *encoding):
    raise ValueError(f'{what}: the private key is not the certificate\'s '
                     '(they do not match); give the key the certificate was '
                     'made with.')


def own_certificate(buffer_dir: str) -> Tuple[bytes, bytes]:
  """The server's own certificate and key, made at the first start.

  They live together in `<buffer_dir>/control.pem` (mode 0600), created at
  once (written aside, then renamed into place), so a crash never leaves a
  certificate without its key. The file is opened without following links
  and must be the process user's own, readable by nobody else.

  Args:
    buffer_dir: the buffer's folder (it must exist).

  Returns:
    (certificate, private key), both PEM.

  Raises:
    AuthenticationError: if the file is a link, another user's, open to
      others, or does not hold one certificate and one key (names the file
      and the fix).
  """
  path = os.path.join(buffer_dir, FILE_NAME)
  try:
    data = private_files.read_private_file(
        path, what='the control service\'s key file')
  except FileNotFoundError:
    certificate, key = new_certificate()
    try:
      private_files.write_private_file(path, key + certificate)
    except FileExistsError:  # Another process made it first: use theirs.
      return own_certificate(buffer_dir)
    return certificate, key
  key, certificates = split_certificates(data)
  if len(certificates) != 1 or b'PRIVATE KEY-----' not in key:
    raise errors.AuthenticationError(
        f'{path} must hold the control service\'s private key and its '
        f'certificate (PEM), got {len(certificates)} certificate(s) and '
        f'{"a" if b"PRIVATE KEY-----" in key else "no"} key. Remove the file: '
        'the server makes a new one, and clients need the new control.token.')
  return certificates[0], key.strip() + b'\n'
