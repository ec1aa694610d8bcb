"""Who may call the control service: token files, protected mode, where a
client looks for its token, and the interceptor on a real gRPC server."""

import os
import stat

import grpc
import pytest

import smart_replay
from smart_replay.control import channel as control
from smart_replay.control import access as control_access


@pytest.mark.unit
@pytest.mark.parametrize('host, loopback', [
    ('127.0.0.1', True), ('127.3.2.1', True), ('::1', True), ('[::1]', True),
    ('localhost', True), ('0.0.0.0', False), ('::', False),
    ('10.254.77.1', False), ('example.invalid', False)])
def test_loopback_is_this_machine_only(host, loopback):
  assert control_access.is_loopback(host) is loopback


@pytest.mark.unit
def test_the_default_token_file_is_made_once_for_its_owner_only(tmp_path):
  access = control_access.ControlAccess()
  buffer_dir = str(tmp_path / 'new' / 'buffer')  # Not there yet.
  token = access.token(buffer_dir)
  path = os.path.join(buffer_dir, control_access.TOKEN_FILE_NAME)
  assert access.token_path(buffer_dir) == path
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
  assert len(token) >= 32 and access.token(buffer_dir) == token  # Kept.
  assert control_access.ControlAccess(auth=False).token(buffer_dir) is None


@pytest.mark.unit
def test_a_token_file_others_can_read_is_refused(tmp_path):
  path = tmp_path / 'token'
  path.write_text('secret\n')
  os.chmod(path, 0o644)
  with pytest.raises(smart_replay.AuthenticationError,
                     match=r'mode 0644: group or others .*`chmod 600'):
    control_access.ControlAccess(token_file=str(path)).token(str(tmp_path))
  os.chmod(path, 0o600)
  assert control_access.read_token_file(str(path), what='x') == 'secret'
  with pytest.raises(smart_replay.AuthenticationError, match='cannot read'):
    control_access.read_token_file(str(tmp_path / 'none'), what='x')


@pytest.mark.unit
def test_protected_mode_refuses_a_service_beyond_loopback_without_auth(
    tmp_path):
  with pytest.raises(ValueError, match=r"protected mode: .* '0.0.0.0', "
                     'beyond loopback, without a token'):
    control_access.ControlAccess(host='0.0.0.0', auth=False)
  control_access.ControlAccess(host='0.0.0.0', auth=False,
                               protected_mode=False)
  control_access.ControlAccess(host='127.0.0.1', auth=False)
  control_access.ControlAccess(host='0.0.0.0')  # With the token.
  with pytest.raises(ValueError, match='tls_cert_file and tls_key_file go '
                     'together'):
    cert = tmp_path / 'cert.pem'
    cert.write_text('x')
    control_access.ControlAccess(tls_cert_file=str(cert))


@pytest.mark.unit
def test_a_client_takes_its_token_from_the_argument_then_the_environment(
    tmp_path):
  given, named = tmp_path / 'given', tmp_path / 'named'
  for path, text in ((given, 'from-file'), (named, 'from-env-file')):
    path.write_text(text)
    os.chmod(path, 0o600)
  resolve = control_access.ClientCredentials.resolve
  both = {control_access.TOKEN_ENV: 'from-env',
          control_access.TOKEN_FILE_ENV: str(named)}
  assert resolve(token_file=str(given), environ=both).token == 'from-file'
  assert resolve(environ=both).token == 'from-env'
  only_file = {control_access.TOKEN_FILE_ENV: str(named)}
  assert resolve(environ=only_file).token == 'from-env-file'
  nothing = resolve(environ={})
  assert nothing.token is None and nothing.metadata() is None
  assert control_access.TOKEN_ENV in nothing.looked
  assert 'from-file' not in repr(resolve(token_file=str(given), environ={}))


def test_the_interceptor_refuses_calls_without_the_token(tmp_path):
  server = control.ControlServer(
      {'info': lambda request: {'ok': 1}}, port=0,
      access=control_access.ControlAccess(), token='right')
  try:
    address = f'127.0.0.1:{server.port}'
    for token in (None, 'wrong', 'righ', 'right2'):
      client = control.ControlClient(
          address, credentials=control_access.ClientCredentials(
              token=token, looked='the test'))
      with pytest.raises(smart_replay.AuthenticationError,
                         match="refused 'info'.*looked in: the test"):
        client.call('info', timeout_s=5)
      client.close()
    with grpc.insecure_channel(address) as channel:  # Raw, as an attacker.
      with pytest.raises(grpc.RpcError) as refused:
        channel.unary_unary(f'/{control.SERVICE}/info')(b'{}', timeout=5)
      assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    client = control.ControlClient(
        address, credentials=control_access.ClientCredentials(token='right'))
    assert client.call('info', timeout_s=5) == {'ok': 1}
    client.close()
  finally:
    server.stop()


def test_the_service_binds_loopback_by_default():
  server = control.ControlServer(
      {'info': lambda request: {}}, port=0,
      access=control_access.ControlAccess(), token='t')
  try:
    assert server.host == '127.0.0.1'
    # Listening sockets of the port, as the kernel lists them (IPv4, and
    # IPv6 with IPv4 mapped: gRPC binds 127.0.0.1 as ::ffff:127.0.0.1).
    bound = set()
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
      with open(table) as f:
        for fields in (line.split() for line in f.readlines()[1:]):
          address, port = fields[1].split(':')
          if fields[3] == '0A' and int(port, 16) == server.port:
            bound.add(address)
    assert bound and bound <= {'0100007F',
                               '0000000000000000FFFF00000100007F'}, bound
  finally:
    server.stop()
