"""The Prometheus endpoint of a served buffer, scraped as Prometheus would."""

import http.client
import logging
import os
import select
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from prometheus_client import parser
import pytest

import smart_replay
from smart_replay.remote import http_server
from smart_replay.remote import metrics
from smart_replay.remote import replay_server
from tests import testing

_HALF_SENT = b'GET /metrics HTTP/1.1\r\nHost: x\r\n'  # No blank line.


def _get(url, token=None, context=None, timeout=30):
  """GETs `url`; returns (status, headers, body), also for an HTTP error."""
  request = urllib.request.Request(url)
  if token is not None:
    request.add_header('Authorization', f'Bearer {token}')
  try:
    with urllib.request.urlopen(request, timeout=timeout,
                                context=context) as response:
      return response.status, response.headers, response.read().decode()
  except urllib.error.HTTPError as e:
    return e.code, e.headers, e.read().decode()


def _scrape(url, token=None, context=None):
  status, _, text = _get(url, token=token, context=context)
  assert status == 200, text
  samples = {}
  for family in parser.text_string_to_metric_families(text):
    for sample in family.samples:
      samples[(sample.name, tuple(sorted(sample.labels.items())))] = (
          sample.value)
  return samples


@pytest.fixture
def served(tmp_path, data_spec):
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec, capacity=1000, sequence_length=2,
      checkpoint_dir=str(tmp_path / 'buffer'))
  server = replay_server.ReplayServer(manager, control_port=None)
  server.start()
  yield server
  server.close(final_checkpoint=False)


def test_scrape_reports_tables_checkpoints_and_connections(served, data_spec):
  client = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=served.manager.server_address,
      control_token_file=served.token_file,
      sample_timeout_s=5.0, write_timeout_s=5.0)
  _, observer = client.connect()
  with metrics.MetricsEndpoint(served, port=0) as endpoint:
    assert endpoint.url.startswith('http://127.0.0.1:')
    record = testing.run_actor(observer, 40, seed=1)
    observer.flush()
    written = len(testing.expected_items(record.steps, 2))
    next(iter(client.get_dataset(batch_size=4, num_steps=2)))
    path = served.checkpoint()
    scraped = _scrape(endpoint.url)
    table = (('table', 'experience'),)
    assert scraped[('smart_replay_up', ())] == 1
    assert scraped[('smart_replay_table_items', table)] == written
    assert scraped[('smart_replay_table_max_items', table)] == 1000
    assert scraped[('smart_replay_table_inserts_total', table)] == written
    assert scraped[('smart_replay_table_samples_total', table)] >= 4
    assert scraped[('smart_replay_table_insert_blocked_seconds', table)] == 0
    assert ('smart_replay_table_sample_wait_seconds_total', table) in scraped
    assert scraped[('smart_replay_checkpoints_total', ())] == 1
    assert 0 <= scraped[('smart_replay_checkpoint_age_seconds', ())] < 60
    assert 0 < scraped[('smart_replay_checkpoint_duration_seconds', ())] < 60
    assert scraped[('smart_replay_checkpoint_failing', ())] == 0
    # The client's gRPC channel (and the server's own client) are connected.
    assert scraped[('smart_replay_reverb_connections', ())] >= 1
    info = [k for k in scraped if k[0] == 'smart_replay_server_info']
    assert info and ('layout', 'packed') in info[0][1]
    assert served.last_checkpoint == path
  client.close()


def test_port_in_use_and_close_twice(served):
  with socket.socket() as taken:
    taken.bind(('127.0.0.1', 0))
    taken.listen()
    port = taken.getsockname()[1]
    with pytest.raises(ValueError, match=f'metrics_port {port} .*in use'):
      metrics.MetricsEndpoint(served, port=port)
  with pytest.raises(ValueError, match='metrics_port.*70000'):
    metrics.MetricsEndpoint(served, port=70000)
  endpoint = metrics.MetricsEndpoint(served, port=0)
  serving = [t for t in threading.enumerate()
             if t.name == 'smart_replay-metrics']
  assert serving and all(t.daemon for t in serving)
  endpoint.close()
  endpoint.close()
  assert not any(t.is_alive() for t in serving)
  with pytest.raises(OSError):
    urllib.request.urlopen(endpoint.url, timeout=5)


@pytest.mark.unit
def test_reverb_connections_counts_established_sockets():
  with socket.socket() as listener:
    listener.bind(('127.0.0.1', 0))
    listener.listen()
    port = listener.getsockname()[1]
    assert metrics.reverb_connections(port) == 0
    with socket.create_connection(('127.0.0.1', port)) as _:
      accepted, _ = listener.accept()
      with accepted:
        assert metrics.reverb_connections(port) == 1


def _wait_for(condition, timeout_s, what):
  """Polls `condition` until true; fails naming `what` after `timeout_s`."""
  deadline = time.monotonic() + timeout_s
  while not condition():
    if time.monotonic() > deadline:
      pytest.fail(f'{what}: not within {timeout_s} s.')
    time.sleep(0.02)


def test_token_is_required_on_every_request(served):
  token = 'aN0ther-s3cret_token~'
  with metrics.MetricsEndpoint(served, port=0, token=token) as endpoint:
    for header in (None, 'wrong-token', token[:-1], token + 'x', ''):
      status, headers, body = _get(endpoint.url, token=header)
      assert status == 401, header
      assert headers['WWW-Authenticate'] == 'Bearer'
      assert 'smart_replay' not in body and 'Bearer <token>' in body
    # The token under another scheme, or with no scheme, is refused too.
    for value in (f'Basic {token}', token):
      request = urllib.request.Request(endpoint.url,
                                       headers={'Authorization': value})
      with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
      assert refused.value.code == 401
    assert _scrape(endpoint.url, token=token)[('smart_replay_up', ())] == 1
    # The scheme is case-insensitive (RFC 7235).
    request = urllib.request.Request(
        endpoint.url, headers={'Authorization': f'bearer {token}'})
    with urllib.request.urlopen(request, timeout=30) as response:
      assert b'smart_replay_up 1.0' in response.read()


def test_half_sent_requests_time_out_and_free_their_threads(served):
  # Caps above the 100 connections: this is about the deadline alone.
  with metrics.MetricsEndpoint(served, port=0, timeout_s=1,
                               max_connections=128,
                               max_connections_per_peer=128) as endpoint:
    baseline = threading.active_count()
    clients = []
    try:
      for _ in range(100):
        client = socket.create_connection(('127.0.0.1', endpoint.port),
                                          timeout=10)
        clients.append(client)
        client.sendall(_HALF_SENT)
      # Each half-sent request holds a thread until its timeout ...
      peak = [0]

      def held():
        peak[0] = max(peak[0], threading.active_count() - baseline)
        return peak[0] >= 50

      _wait_for(held, 5, 'the half-sent requests got threads')
      # ... while a normal scrape is still answered.
      scraped = _scrape(endpoint.url)
      assert scraped[('smart_replay_up', ())] == 1
      _wait_for(lambda: threading.active_count() <= baseline + 2, 10,
                f'threads back to {baseline} (+2) from {peak[0]} more')
      for client in clients:  # The server hung up on every one of them.
        assert client.recv(1) == b''
    finally:
      for client in clients:
        client.close()
    assert _scrape(endpoint.url)[('smart_replay_up', ())] == 1


def test_a_request_trickled_in_is_dropped_at_its_deadline(served):
  # A byte now and then resets a socket timeout, but not the deadline.
  with metrics.MetricsEndpoint(served, port=0, timeout_s=1) as endpoint:
    with socket.create_connection(('127.0.0.1', endpoint.port),
                                  timeout=10) as client:
      request = _HALF_SENT + b'X-Padding: ' + b'a' * 1000
      start, dropped = time.monotonic(), False
      for byte in request:
        if time.monotonic() - start > 5:
          break
        client.sendall(bytes([byte]))
        readable, _, _ = select.select([client], [], [], 0.2)  # Pacing.
        if readable:
          dropped = client.recv(1) == b''
          break
      assert dropped, 'the trickled request was served to its end'
      assert time.monotonic() - start < 3


def _ipv6_loopback():
  try:
    with socket.socket(socket.AF_INET6) as probe:
      probe.bind(('::1', 0))
  except OSError:
    return ()
  return ('::1',)


_IPV6_LOOPBACK = _ipv6_loopback()


def test_protected_mode_needs_authentication_off_loopback(served):
  with pytest.raises(ValueError, match=r"host '0\.0\.0\.0' .*token is None"):
    metrics.MetricsEndpoint(served, port=0, host='0.0.0.0')
  with metrics.MetricsEndpoint(served, port=0, host='0.0.0.0',
                               allow_unauthenticated_remote=True) as endpoint:
    local = f'http://127.0.0.1:{endpoint.port}/metrics'
    assert _scrape(local)[('smart_replay_up', ())] == 1
  with metrics.MetricsEndpoint(served, port=0, host='0.0.0.0',
                               token='t0ken') as endpoint:
    local = f'http://127.0.0.1:{endpoint.port}/metrics'
    assert _get(local)[0] == 401
    assert _scrape(local, token='t0ken')[('smart_replay_up', ())] == 1
  for host in ('localhost', '127.0.0.2') + _IPV6_LOOPBACK:  # Need nothing.
    with metrics.MetricsEndpoint(served, port=0, host=host) as endpoint:
      assert _scrape(endpoint.url)[('smart_replay_up', ())] == 1
  if _IPV6_LOOPBACK:
    assert endpoint.url == f'http://[::1]:{endpoint.port}/metrics'


_OPENSSL_CONFIG = """
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@pytest.fixture(scope='module')
def pki(tmp_path_factory):
  """A throwaway CA; a server certificate for 127.0.0.1 and localhost, a
  client certificate it signed, and a self-signed (rogue) client's."""
  if shutil.which('openssl') is None:
    pytest.skip('the openssl command is not installed')
  folder = tmp_path_factory.mktemp('pki')
  config = folder / 'openssl.cnf'
  config.write_text(_OPENSSL_CONFIG)

  def openssl(*args):
    subprocess.run(['openssl', *args], cwd=folder, check=True,
                   capture_output=True)

  new_key = ('-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1',
             '-nodes')
  openssl('req', '-x509', '-config', config, '-extensions', 'ca', *new_key,
          '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '1', '-subj',
          '/CN=smart_replay test CA')
  for name, serial in (('server', '2'), ('client', '3')):
    openssl('req', '-new', '-config', config, *new_key, '-keyout',
            f'{name}.key', '-out', f'{name}.csr', '-subj', f'/CN={name}')
    openssl('x509', '-req', '-in', f'{name}.csr', '-CA', 'ca.pem', '-CAkey',
            'ca.key', '-set_serial', serial, '-days', '1', '-extfile', config,
            '-extensions', name, '-out', f'{name}.pem')
  openssl('req', '-x509', '-config', config, '-extensions', 'client',
          *new_key, '-keyout', 'rogue.key', '-out', 'rogue.pem', '-days', '1',
          '-subj', '/CN=rogue')
  return {name: str(folder / name) for name in (
      'ca.pem', 'server.pem', 'server.key', 'client.pem', 'client.key',
      'rogue.pem', 'rogue.key')}


def _client_context(pki, cert=None):
  context = ssl.create_default_context(cafile=pki['ca.pem'])
  if cert is not None:
    context.load_cert_chain(pki[f'{cert}.pem'], pki[f'{cert}.key'])
  return context


def test_https_serves_metrics_to_clients_trusting_the_ca(served, pki):
  with metrics.MetricsEndpoint(
      served, port=0, tls_cert_file=pki['server.pem'],
      tls_key_file=pki['server.key'], timeout_s=5) as endpoint:
    assert endpoint.url.startswith('https://127.0.0.1:')
    # A client that connects and never starts its handshake holds only its
    # own thread, not the accepting one.
    with socket.create_connection(('127.0.0.1', endpoint.port)):
      scraped = _scrape(endpoint.url, context=_client_context(pki))
    assert scraped[('smart_replay_up', ())] == 1
    localhost = endpoint.url.replace('127.0.0.1', 'localhost')
    assert _scrape(localhost, context=_client_context(pki))
    with pytest.raises(urllib.error.URLError, match='CERTIFICATE_VERIFY'):
      _get(endpoint.url, context=ssl.create_default_context())  # No CA.
    with pytest.raises(OSError):  # Plain HTTP gets no answer.
      _get(endpoint.url.replace('https:', 'http:'), timeout=10)


def test_mutual_tls_needs_a_client_certificate_from_the_ca(served, pki):
  # Client certificates count as authentication: 0.0.0.0 needs no token.
  with metrics.MetricsEndpoint(
      served, port=0, host='0.0.0.0', tls_cert_file=pki['server.pem'],
      tls_key_file=pki['server.key'],
      tls_client_ca_file=pki['ca.pem']) as endpoint:
    url = f'https://127.0.0.1:{endpoint.port}/metrics'
    for refused in (None, 'rogue'):
      with pytest.raises(OSError):
        _get(url, context=_client_context(pki, cert=refused), timeout=10)
    scraped = _scrape(url, context=_client_context(pki, cert='client'))
    assert scraped[('smart_replay_up', ())] == 1
  # With a token as well, both are needed.
  with metrics.MetricsEndpoint(
      served, port=0, token='t0ken', tls_cert_file=pki['server.pem'],
      tls_key_file=pki['server.key'],
      tls_client_ca_file=pki['ca.pem']) as endpoint:
    context = _client_context(pki, cert='client')
    assert _get(endpoint.url, context=context)[0] == 401
    assert _scrape(endpoint.url, token='t0ken', context=context)


def test_arguments_are_checked_before_serving(served, pki, tmp_path):
  cert, key = pki['server.pem'], pki['server.key']
  for kwargs in ({'tls_cert_file': cert}, {'tls_key_file': key}):
    with pytest.raises(ValueError, match='tls_cert_file and tls_key_file'):
      metrics.MetricsEndpoint(served, port=0, **kwargs)
  missing = str(tmp_path / 'missing.pem')
  with pytest.raises(ValueError, match=f"tls_key_file '{missing}' does not"):
    metrics.MetricsEndpoint(served, port=0, tls_cert_file=cert,
                            tls_key_file=missing)
  with pytest.raises(ValueError, match='tls_client_ca_file=.* needs'):
    metrics.MetricsEndpoint(served, port=0, tls_client_ca_file=cert)
  with pytest.raises(ValueError, match='tls_cert_file .* tls_key_file .*'
                     'could not be loaded'):  # Not this certificate's key.
    metrics.MetricsEndpoint(served, port=0, tls_cert_file=cert,
                            tls_key_file=pki['client.key'])
  encrypted = tmp_path / 'encrypted.key'
  subprocess.run(['openssl', 'pkey', '-in', key, '-aes256', '-passout',
                  'pass:x', '-out', encrypted], check=True)
  with pytest.raises(ValueError, match='tls_key_file .* is encrypted'):
    metrics.MetricsEndpoint(served, port=0, tls_cert_file=cert,
                            tls_key_file=encrypted)
  with pytest.raises(ValueError, match='token must be a non-empty string'):
    metrics.MetricsEndpoint(served, port=0, token='')
  with pytest.raises(ValueError, match='token must not contain whitespace') \
      as caught:
    metrics.MetricsEndpoint(served, port=0, token='s3cret\n')
  assert 's3cret' not in str(caught.value)
  for timeout_s in (0, -1.0, float('inf'), '10'):
    with pytest.raises(ValueError, match=f'timeout_s .*{timeout_s!r}'):
      metrics.MetricsEndpoint(served, port=0, timeout_s=timeout_s)


def _info_labels(scraped):
  (labels,) = [dict(k[1]) for k in scraped
               if k[0] == 'smart_replay_server_info']
  return labels


def test_labels_hide_paths_and_address_without_authentication(served):
  buffer_dir = served.manager.checkpoint_dir
  with metrics.MetricsEndpoint(served, port=0) as endpoint:
    _, _, text = _get(endpoint.url)
    labels = _info_labels(_scrape(endpoint.url))
  assert labels['checkpoint_dir'] == '<buffer>'
  assert labels['address'] == '<address>'
  assert labels['layout'] == 'packed'
  for secret in (buffer_dir, os.path.realpath(buffer_dir), served.address,
                 socket.gethostname()):
    assert secret not in text
  # Callers who show the token see them.
  with metrics.MetricsEndpoint(served, port=0, token='t0ken') as endpoint:
    labels = _info_labels(_scrape(endpoint.url, token='t0ken'))
  assert labels['checkpoint_dir'] == buffer_dir
  assert labels['address'] == served.address


# Opens half-sent requests to a port, as another process (an attacker would
# be one): argv[1] the port, then `<source address>=<count>` pairs. Prints
# 'opened' once every connection is made; then, for each line it reads,
# the number of its connections the server has closed; exits at EOF.
_FLOODER = r"""
import select, socket, sys
port, sockets = int(sys.argv[1]), []
for pair in sys.argv[2:]:
  source, count = pair.split('=')
  for _ in range(int(count)):
    s = socket.socket()
    s.settimeout(30)
    s.bind((source, 0))
    s.connect(('127.0.0.1', port))
    s.sendall(b'GET /metrics HTTP/1.1\r\nHost: x\r\n')
    sockets.append(s)
print('opened', flush=True)
closed = set()
for _ in sys.stdin:
  for s in sockets:
    if s not in closed and select.select([s], [], [], 0)[0]:
      try:
        if not s.recv(1):
          closed.add(s)
      except OSError:
        closed.add(s)
  print(len(closed), flush=True)
"""


class _Flood:
  """A flooding process: half-sent requests from loopback addresses."""

  def __init__(self, port, **counts):
    self._process = subprocess.Popen(
        [sys.executable, '-c', _FLOODER, str(port)] +
        [f'{source}={n}' for source, n in counts.items()],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert self._process.stdout.readline() == 'opened\n'

  def closed_by_server(self):
    self._process.stdin.write('?\n')
    self._process.stdin.flush()
    return int(self._process.stdout.readline())

  def stop(self):
    self._process.kill()
    self._process.wait()


def _open_fds():
  return len(os.listdir('/proc/self/fd'))


class _Peaks:
  """Samples this process's threads and open files until stopped."""

  def __init__(self):
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self._thread.start()
    self.threads = self.fds = 0
    self.base_threads, self.base_fds = threading.active_count(), _open_fds()

  def _sample(self):
    while not self._stop.wait(0.005):
      self.threads = max(self.threads, threading.active_count())
      self.fds = max(self.fds, _open_fds())

  def stop(self):
    self._stop.set()
    self._thread.join()


def _scrape_from(source, port, token):
  """A scrape from the loopback address `source`: (status, seconds)."""
  start = time.monotonic()
  connection = http.client.HTTPConnection(
      '127.0.0.1', port, timeout=10, source_address=(source, 0))
  try:
    connection.request('GET', '/metrics',
                       headers={'Authorization': f'Bearer {token}'})
    response = connection.getresponse()
    body = response.read().decode()
  finally:
    connection.close()
  assert response.status != 200 or 'smart_replay_up 1.0' in body, body
  return response.status, time.monotonic() - start


_REFUSED = (http.client.RemoteDisconnected, ConnectionResetError,
            BrokenPipeError)


def _served_from(source, port, token):
  """Whether a scrape from `source` is served (not refused at accept)."""
  try:
    return _scrape_from(source, port, token)[0] == 200
  except _REFUSED:
    return False


def _refused_lines(caplog):
  return [r for r in caplog.records if r.levelno == logging.WARNING and
          'Metrics endpoint: refused' in r.getMessage()]


def test_a_connection_flood_is_refused_at_accept(served, caplog):
  caplog.set_level(logging.WARNING)
  token = 't0ken'
  # A long timeout: the flood's connections hold their slots to the end.
  with metrics.MetricsEndpoint(served, port=0, token=token,
                               timeout_s=120) as endpoint:
    assert endpoint.refused_connections == 0
    peaks = _Peaks()
    start = time.monotonic()
    flood = _Flood(endpoint.port, **{'127.0.0.1': 200, '127.0.0.2': 50})
    try:
      # Each address gets its 4 connections; the others are closed at once.
      _wait_for(lambda: endpoint.refused_connections >= 242, 60,
                f'242 refused (got {endpoint.refused_connections})')
      _wait_for(lambda: flood.closed_by_server() == 242, 30,
                'the flooder saw its 242 refused connections closed')
      _wait_for(lambda: threading.active_count() >= peaks.base_threads + 8,
                30, 'the 8 admitted connections got their threads')
      # An authenticated scrape from another address is served at once;
      # one from the flooded address finds its 4 slots taken.
      status, seconds = _scrape_from('127.0.0.3', endpoint.port, token)
      assert status == 200 and seconds < 5, seconds
      with pytest.raises(_REFUSED):
        _scrape_from('127.0.0.1', endpoint.port, token)
      assert endpoint.refused_connections == 243
      peaks.stop()
      # 8 threads and sockets for the flood (not 250), 1 for a scrape; a
      # few more files: the scrape's own socket, one being refused, the
      # pipes to the flooder, and a margin for the rest of the process.
      assert peaks.threads <= peaks.base_threads + 8 + 4, (
          peaks.threads, peaks.base_threads)
      assert peaks.fds <= peaks.base_fds + 8 + 12, (
          peaks.fds, peaks.base_fds)
    finally:
      peaks.stop()
      flood.stop()
    elapsed = time.monotonic() - start
    lines = _refused_lines(caplog)
    assert 1 <= len(lines) <= 2 + elapsed / 10, [
        r.getMessage() for r in lines]
    assert 'at most 16 at once and 4 per client address' in (
        lines[0].getMessage())
    # The flood's slots come back as its connections close (a scrape may
    # be refused until they have).
    _wait_for(lambda: _served_from('127.0.0.1', endpoint.port, token), 30,
              'a scrape from 127.0.0.1 after the flood')
    scraped = _scrape(endpoint.url, token=token)
    assert scraped[('smart_replay_metrics_refused_connections_total',
                    ())] == endpoint.refused_connections >= 243


def test_the_connection_cap_holds_across_addresses(served):
  with metrics.MetricsEndpoint(served, port=0, timeout_s=120,
                               max_connections=6) as endpoint:
    base_threads = threading.active_count()
    flood = _Flood(endpoint.port, **{'127.0.0.1': 10, '127.0.0.2': 10})
    try:  # 4 from the first address, and the 2 slots left to the second.
      _wait_for(lambda: endpoint.refused_connections >= 14, 60,
                f'14 refused (got {endpoint.refused_connections})')
      _wait_for(lambda: threading.active_count() >= base_threads + 6, 30,
                'the 6 admitted connections got their threads')
      with pytest.raises(_REFUSED):
        _scrape_from('127.0.0.3', endpoint.port, 'unused')
      assert endpoint.refused_connections == 15
      assert threading.active_count() <= base_threads + 6 + 2
    finally:
      flood.stop()
    _wait_for(lambda: _served_from('127.0.0.3', endpoint.port, 'unused'),
              30, 'a scrape after the flood')


@pytest.mark.unit
def test_peer_key_counts_ipv6_sites_as_one_peer():
  assert http_server.peer_key('10.0.0.7') == '10.0.0.7'
  assert http_server.peer_key('::ffff:10.0.0.7') == '10.0.0.7'
  assert http_server.peer_key('::1') == '::1'
  assert http_server.peer_key('2001:db8:1:2:3:4:5:6') == '2001:db8:1:2::/64'
  assert http_server.peer_key('fe80::1%eth0') == 'fe80::/64'


def test_connection_caps_are_checked(served):
  for value in (0, -1, True, 1.5, '16', None):
    with pytest.raises(ValueError,
                       match=f'max_connections must be a positive integer.*'
                       f'got {value!r}'):
      metrics.MetricsEndpoint(served, port=0, max_connections=value)
    with pytest.raises(ValueError, match='max_connections_per_peer must be '
                       f'a positive integer.*got {value!r}'):
      metrics.MetricsEndpoint(served, port=0, max_connections_per_peer=value)
  with pytest.raises(ValueError, match='max_connections_per_peer must be at '
                     'most max_connections=2, got 3'):
    metrics.MetricsEndpoint(served, port=0, max_connections=2,
                            max_connections_per_peer=3)
