"""Who may call the control service and whom a client trusts: token files,
the server's own certificate, protected mode, where a client looks for its
token, and the interceptor, deadlines and slow-call queue on a real gRPC
server."""

import concurrent.futures
import os
import socket
import stat
import threading
import time

import grpc
import pytest

import smart_replay
from smart_replay.control import access as control_access
from smart_replay.control import certificates
from smart_replay.control import client as control_client
from smart_replay.control import server as control_server
from smart_replay.control import credentials as credentials_lib
from smart_replay.control import protocol
from smart_replay.control import tokens
from smart_replay.utils import listening


@pytest.mark.unit
@pytest.mark.parametrize('host, loopback', [
    ('127.0.0.1', True), ('127.3.2.1', True), ('::1', True), ('[::1]', True),
    ('localhost', True), ('0.0.0.0', False), ('::', False),
    ('10.254.77.1', False), ('example.invalid', False)])
def test_loopback_is_this_machine_only(host, loopback):
  assert control_access.is_loopback(host) is loopback


@pytest.mark.unit
def test_a_server_makes_its_tokens_and_certificate_once(tmp_path):
  buffer_dir = str(tmp_path / 'new' / 'buffer')  # Not there yet.
  made = control_access.ControlAccess().secrets(buffer_dir)
  assert stat.S_IMODE(os.stat(buffer_dir).st_mode) == 0o700
  for name in ('control.pem', 'control.token', 'reader.token'):
    assert stat.S_IMODE(os.stat(os.path.join(buffer_dir, name)).st_mode) == (
        0o600), name
  operator = tokens.read_token_file(made.operator_file, what='x')
  reader = tokens.read_token_file(made.reader_file, what='x')
  assert operator.token == made.operator_token != made.reader_token
  assert operator.certificate == reader.certificate
  assert certificates.is_own(operator.certificate)
  assert made.fingerprint == certificates.fingerprint(operator.certificate)
  again = control_access.ControlAccess().secrets(buffer_dir)  # Kept.
  assert (again.operator_token, again.reader_token, again.fingerprint) == (
      made.operator_token, made.reader_token, made.fingerprint)
  os.remove(os.path.join(buffer_dir, 'control.pem'))  # A new certificate:
  renewed = control_access.ControlAccess().secrets(buffer_dir)
  assert renewed.operator_token == made.operator_token  # same token,
  assert renewed.fingerprint != made.fingerprint  # new certificate in it.
  assert tokens.read_token_file(made.operator_file, what='x').certificate \
      != operator.certificate
  none = control_access.ControlAccess(auth=False).secrets(str(tmp_path / 'b'))
  assert none.operator_token is None and none.credentials is None


@pytest.mark.unit
def test_a_token_file_that_is_not_safe_is_refused(tmp_path):
  path = tmp_path / 'token'
  path.write_text('secret\n')
  os.chmod(path, 0o644)
  with pytest.raises(smart_replay.AuthenticationError,
                     match=r'mode 0644: group or others .*`chmod 600'):
    control_access.ControlAccess(token_file=str(path)).secrets(str(tmp_path))
  os.chmod(path, 0o600)
  assert tokens.read_token_file(str(path), what='x').token == 'secret'
  link = tmp_path / 'link'
  link.symlink_to(path)
  with pytest.raises(smart_replay.AuthenticationError,
                     match='is a symbolic link; links are never followed'):
    tokens.read_token_file(str(link), what='x')
  with pytest.raises(smart_replay.AuthenticationError, match='no such file'):
    tokens.read_token_file(str(tmp_path / 'none'), what='x')
  if os.geteuid() == 0:  # Root can give it away: another user's file.
    os.chown(path, 12345, 12345)
    with pytest.raises(smart_replay.AuthenticationError,
                       match='belongs to uid 12345, not to this process'):
      tokens.read_token_file(str(path), what='x')


@pytest.mark.unit
def test_a_planted_link_in_place_of_the_server_files_is_refused(tmp_path):
  elsewhere = tmp_path / 'elsewhere.token'
  tokens.new_token_file(str(elsewhere))
  for name in ('control.token', 'control.pem'):
    buffer_dir = tmp_path / name.replace('.', '_')
    buffer_dir.mkdir(mode=0o700)
    (buffer_dir / name).symlink_to(elsewhere)
    with pytest.raises(smart_replay.UnsafeBufferDirError,
                       match='symbolic link'):
      control_access.ControlAccess().secrets(str(buffer_dir))
  # The same file opened on its own (a token file given): never followed.
  with pytest.raises(smart_replay.AuthenticationError, match='symbolic link'):
    tokens.read_token_file(str(tmp_path / 'control_token' / 'control.token'),
                           what='x')


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


def _token_file(path, token, certificate=None):
  path.write_bytes(tokens.TokenFile(token, certificate).encode())
  os.chmod(path, 0o600)
  return str(path)


@pytest.fixture(scope='module')
def own():
  """A server certificate and its key (PEM)."""
  return certificates.new_certificate()


@pytest.mark.unit
def test_a_client_takes_its_token_from_the_argument_then_the_environment(
    tmp_path, own):
  certificate = own[0]
  given = _token_file(tmp_path / 'given', 'from-file', certificate)
  named = _token_file(tmp_path / 'named', 'from-env-file', certificate)
  resolve = credentials_lib.ClientCredentials.resolve
  both = {credentials_lib.TOKEN_ENV: 'from-env',
          credentials_lib.TOKEN_FILE_ENV: named}
  assert resolve(token_file=given, environ=both).token == 'from-file'
  only_file = {credentials_lib.TOKEN_FILE_ENV: named}
  assert resolve(environ=only_file).token == 'from-env-file'
  nothing = resolve(environ={})
  assert nothing.token is None and nothing.metadata() is None
  assert credentials_lib.TOKEN_ENV in nothing.looked
  pinned = resolve(token_file=given, environ={})
  assert 'from-file' not in repr(pinned)
  assert pinned.channel_credentials is not None
  assert pinned.channel_options == (
      ('grpc.ssl_target_name_override', certificates.SERVER_NAME),)
  assert certificates.fingerprint(certificate) in pinned.trusts


@pytest.mark.unit
def test_a_client_never_sends_a_token_it_cannot_pin(tmp_path, own):
  resolve = credentials_lib.ClientCredentials.resolve
  bare = _token_file(tmp_path / 'bare', 'secret')  # No certificate.
  for kwargs in ({'token_file': bare, 'environ': {}},
                 {'environ': {credentials_lib.TOKEN_ENV: 'secret'}}):
    with pytest.raises(smart_replay.AuthenticationError,
                       match='refusing to send the control token .* without '
                       'TLS.*control_tls_ca_file'):
      resolve(**kwargs)
  ca_file = tmp_path / 'ca.pem'
  ca_file.write_bytes(own[0])
  with_ca = resolve(environ={credentials_lib.TOKEN_ENV: 'secret'},
                    tls_ca_file=str(ca_file))
  assert with_ca.token == 'secret' and with_ca.channel_credentials


HANDLERS = {
    protocol.INFO: lambda request: {'ok': 1},
    protocol.CHECKPOINT: lambda request: {'saved': request.get('n', 0)},
}


@pytest.fixture
def served(tmp_path):
  """`start(handlers=HANDLERS, access=ControlAccess())`: a control server
  with its own tokens and certificate in `tmp_path / 'buffer'`; returns
  `(server, secrets)`."""
  servers = []

  def start(handlers=None, access=None):
    access = access or control_access.ControlAccess()
    secrets = access.secrets(str(tmp_path / 'buffer'))
    server = control_server.ControlServer(handlers or HANDLERS, port=0,
                                   access=access, secrets=secrets)
    servers.append(server)
    return server, secrets

  yield start
  for server in servers:
    server.stop(0)


def _client(server, token_file=None, **kwargs):
  return control_client.ControlClient(
      f'localhost:{server.port}',
      credentials=credentials_lib.ClientCredentials.resolve(
          token_file=token_file, environ={}, **kwargs))


def test_the_operator_token_calls_everything_the_reader_token_only_reads(
    served):
  server, secrets = served()
  operator = _client(server, secrets.operator_file)
  assert operator.address == f'127.0.0.1:{server.port}'  # Never localhost.
  assert operator.call(protocol.INFO, timeout_s=10) == {'ok': 1}
  assert operator.call(protocol.CHECKPOINT, {'n': 3}, timeout_s=10) == {
      'saved': 3}
  reader = _client(server, secrets.reader_file)
  assert reader.call(protocol.INFO, timeout_s=10) == {'ok': 1}
  with pytest.raises(smart_replay.AuthenticationError,
                     match="refused 'checkpoint': the reader token may call "
                     'only the methods that read'):
    reader.call(protocol.CHECKPOINT, timeout_s=10)
  for client in (operator, reader):
    client.close()


def test_calls_without_a_valid_token_are_refused_before_their_body(served):
  server, secrets = served()
  certificate = tokens.read_token_file(secrets.operator_file,
                                       what='x').certificate
  tls = grpc.ssl_channel_credentials(certificate)
  options = certificates.channel_options(certificate)
  address = f'127.0.0.1:{server.port}'
  for token in (None, 'wrong', secrets.operator_token[:-1],
                secrets.operator_token + 'x'):
    client = control_client.ControlClient(
        address, credentials=credentials_lib.ClientCredentials(
            token=token, looked='the test', channel_credentials=tls,
            channel_options=tuple(options)))
    with pytest.raises(smart_replay.AuthenticationError,
                       match="refused 'info'.*looked in: the test"):
      client.call(protocol.INFO, timeout_s=10)
    client.close()
  # Raw calls whose body never comes (the review's M1): 3 x MAX_CALLS of
  # them are each refused at once, and a token holder is served meanwhile.
  with grpc.secure_channel(address, tls, options=options) as channel:
    method = channel.stream_unary(f'/{protocol.SERVICE}/{protocol.INFO}')
    never = threading.Event()

    def no_body():
      never.wait(60)
      yield b'{}'

    pending = [method.future(no_body(), timeout=60)
               for _ in range(3 * control_server.MAX_CALLS)]
    codes = {f.exception(timeout=30).code() for f in pending}
    assert codes == {grpc.StatusCode.UNAUTHENTICATED}
    never.set()
  operator = _client(server, secrets.operator_file)
  started = time.monotonic()
  assert operator.call(protocol.INFO, timeout_s=10) == {'ok': 1}
  assert time.monotonic() - started < 5
  operator.close()


def test_a_call_without_a_deadline_is_refused(served):
  server, secrets = served()
  held = tokens.read_token_file(secrets.operator_file, what='x')
  with grpc.secure_channel(
      f'127.0.0.1:{server.port}', grpc.ssl_channel_credentials(
          held.certificate),
      options=certificates.channel_options(held.certificate)) as channel:
    with pytest.raises(grpc.RpcError) as refused:
      channel.unary_unary(f'/{protocol.SERVICE}/{protocol.INFO}')(
          b'{}', metadata=((protocol.METADATA_KEY,
                            protocol.SCHEME + held.token),))
  assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  assert 'deadline of at most 3600 s' in refused.value.details()


def test_the_token_goes_to_the_buffers_own_server_only(served, tmp_path):
  """The review's H1 and M2 with TLS: an impostor on the address a client
  dials (here a TLS server with another certificate, and a plain one) gets
  no token, and the client says why."""
  server, secrets = served()
  seen = []

  def record(request, context):
    seen.append(dict(context.invocation_metadata()))
    return b'{"result": {}}'

  other_cert, other_key = certificates.new_certificate()
  for credentials in (grpc.ssl_server_credentials([(other_key, other_cert)]),
                      None):
    impostor = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    impostor.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        protocol.SERVICE, {protocol.INFO: grpc.unary_unary_rpc_method_handler(
            record)})])
    port = (impostor.add_secure_port('127.0.0.1:0', credentials) if
            credentials else impostor.add_insecure_port('127.0.0.1:0'))
    impostor.start()
    client = control_client.ControlClient(
        f'127.0.0.1:{port}', credentials=credentials_lib.ClientCredentials
        .resolve(token_file=secrets.operator_file, environ={}))
    with pytest.raises(smart_replay.AuthenticationError,
                       match='did not prove it is the buffer\'s server'):
      client.call(protocol.INFO, timeout_s=5)
    client.close()
    impostor.stop(0)
  assert seen == []


def test_slow_calls_are_served_in_turn_while_others_flood(served):
  """The review's C1: two clients looping slow calls do not starve a third
  one; it waits its turn (first come, first served) and is served."""
  entered = threading.Semaphore(0)

  def slow(request):
    entered.release()
    time.sleep(0.2)
    return {'who': request.get('who')}

  server, secrets = served({protocol.INFO: lambda r: {},
                            protocol.CHECKPOINT: slow})
  stop = threading.Event()

  def flood():
    client = _client(server, secrets.operator_file)
    while not stop.is_set():
      client.call(protocol.CHECKPOINT, {'who': 'flood'}, timeout_s=30)
    client.close()

  floods = [threading.Thread(target=flood) for _ in range(3)]
  for thread in floods:
    thread.start()
  for _ in range(6):  # The floods hold the slow slots.
    assert entered.acquire(timeout=30)
  polite = _client(server, secrets.operator_file)
  try:
    assert polite.call(protocol.CHECKPOINT, {'who': 'polite'},
                       timeout_s=10) == {'who': 'polite'}
  finally:
    stop.set()
    for thread in floods:
      thread.join(60)
    polite.close()


def test_the_service_binds_loopback_and_closes_silent_connections(served):
  server, _ = served()
  assert server.host == '127.0.0.1'
  # IPv4, and IPv6 with IPv4 mapped: gRPC binds 127.0.0.1 as
  # ::ffff:127.0.0.1.
  assert listening.addresses(server.port) == ['127.0.0.1']
  # A TCP connection that never starts its TLS handshake (the review's M3)
  # is closed by the server.
  with socket.create_connection(('127.0.0.1', server.port)) as silent:
    silent.settimeout(control_server.HANDSHAKE_TIMEOUT_S + 30)
    started = time.monotonic()
    assert silent.recv(1) == b''
    assert time.monotonic() - started < control_server.HANDSHAKE_TIMEOUT_S + 30


def test_clear_errors_for_mismatched_files_and_the_wrong_protocol(
    served, tmp_path, own):
  cert_file, key_file = tmp_path / 'cert.pem', tmp_path / 'key.pem'
  cert_file.write_bytes(own[0])
  key_file.write_bytes(certificates.new_certificate()[1])  # Another key.
  os.chmod(key_file, 0o600)
  with pytest.raises(ValueError, match='the private key is not the '
                     'certificate\'s'):
    control_access.ControlAccess(
        tls_cert_file=str(cert_file),
        tls_key_file=str(key_file)).secrets(str(tmp_path / 'b'))
  plain, _ = served(access=control_access.ControlAccess(auth=False))
  ca_file = tmp_path / 'ca.pem'
  ca_file.write_bytes(own[0])
  with pytest.raises(smart_replay.AuthenticationError,
                     match='does not speak TLS'):
    _client(plain, tls_ca_file=str(ca_file)).call(protocol.INFO,
                                                  timeout_s=5)


def test_a_refused_method_name_cannot_forge_log_lines(served, caplog):
  """The review's L1: a method name with a line break is logged escaped, on
  the refusal's own line."""
  server, secrets = served()
  certificate = tokens.read_token_file(secrets.operator_file,
                                       what='x').certificate
  caplog.set_level('WARNING')
  with grpc.secure_channel(
      f'127.0.0.1:{server.port}', grpc.ssl_channel_credentials(certificate),
      options=certificates.channel_options(certificate)) as channel:
    with pytest.raises(grpc.RpcError):
      channel.unary_unary(
          f'/{protocol.SERVICE}/x\nW1127 FORGED: all clear')(b'{}', timeout=10)
  lines = [r.getMessage() for r in caplog.records
           if 'refused without a valid token' in r.getMessage()]
  assert lines and all('\n' not in line for line in lines), lines
  assert '\\nW1127 FORGED' in lines[0]


def test_a_client_without_a_token_is_told_the_server_wants_one(served):
  server, _ = served()
  client = control_client.ControlClient(f'127.0.0.1:{server.port}')  # Plain TCP.
  started = time.monotonic()
  with pytest.raises(smart_replay.AuthenticationError,
                     match='serves TLS, as a server that asks for tokens '
                     'does, and this client has no token'):
    client.call(protocol.INFO, timeout_s=30)
  assert time.monotonic() - started < 10  # Refused, not timed out.
  client.close()
