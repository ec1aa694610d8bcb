"""The attacks of the control-service security review, replayed on a server.

Every attack of /work/shared/notes/security-review.md (F1-F11) is made
against a real in-process `ReplayServer` over raw gRPC, as the reviewer made
them: `/smart_replay.Control/<method>` with hand-made JSON bytes, with and
without the metadata `authorization: Bearer <token>`. A default server
refuses every call without its token (`UNAUTHENTICATED`); a server with
`ControlAccess(auth=False)`, or a caller holding the token (an
authenticated but malicious client), reaches the handlers, whose own
defences (schema, ids, no paths from the network, limits) must hold too.

Each test shows the attack refused with a clear error, the server still
serving, and nothing lost: item counts, the serving instance and the
checkpoints on disk unchanged. Records and files an attacker with access to
the buffer's directory would write are written by hand. The last tests check
that the redaction of answers to callers nobody authenticated hides every
path and leaves the coordinated protocol working.
"""

import concurrent.futures
import json
import logging
import os
import socket
import threading
import time

import grpc
import pytest

import smart_replay
from smart_replay.backends import coordinated_checkpoints as coordinated_client
from smart_replay.remote import handlers
from smart_replay.remote import replay_server as serve
from smart_replay.remote import serving_record
from smart_replay.control import client as control_client
from smart_replay.control import access as control_access
from smart_replay.control import certificates
from smart_replay.control import credentials as credentials_lib
from smart_replay.control import protocol
from smart_replay.control import tokens
from smart_replay.storage import coordinated_records
from smart_replay.storage import checkpoint_folders
from tests import testing
from tests.smart_replay.remote import remote_workers
from tests.smart_replay.remote import in_process_shards

TABLE = 'experience'
FAR_FUTURE_ID = '99991231T235959999999Z-deadbeef'
METHODS = ('info', 'checkpoint', 'times_sampled', 'coordinated_save',
           'coordinated_commit', 'coordinated_list', 'coordinated_restore')


# --- The server, its legitimate clients, and the attacker. -----------------


@pytest.fixture
def server_for(tmp_path, data_spec):
  """`start(name, auth=True, token_file=None, **server_kwargs)`: a started
  `ReplayServer` of a small buffer in `tmp_path / name`, its control service
  on Reverb's port + 1 (loopback; its token in `token_file`, default
  `<buffer>/control.token`); closed without a final checkpoint after the
  test."""
  servers = []

  def start(name='buffer', *, auth=True, token_file=None, tls_cert_file=None,
            tls_key_file=None, **kwargs):
    port = remote_workers.free_port_pair()
    manager = smart_replay.ReplayBufferManager(
        data_spec=data_spec, capacity=200, sequence_length=2,
        checkpoint_dir=str(tmp_path / name), port=port)
    server = serve.ReplayServer(
        manager, control_port=port + 1,
        access=control_access.ControlAccess(
            auth=auth, token_file=token_file, tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file),
        **kwargs)
    server.start()
    servers.append(server)
    return server

  yield start
  for server in servers:
    server.close(final_checkpoint=False)


class Attacker:
  """Raw gRPC to a server's control port: hand-made bytes, any metadata.

  Args:
    server: the `ReplayServer`.
    token: the token to present as `Bearer <token>`; None: none.
  """

  def __init__(self, server, token=None):
    address = f'127.0.0.1:{server.control_port}'
    # TLS as the server serves it (it does whenever it has tokens).
    certificate = _held(server).certificate if server.token_file else None
    self.channel = grpc.secure_channel(
        address, grpc.ssl_channel_credentials(certificate),
        options=certificates.channel_options(certificate)) if certificate \
        else grpc.insecure_channel(address)
    self.metadata = (None if token is None else
                     (('authorization', f'Bearer {token}'),))

  def send(self, method, body, *, metadata='own', timeout_s=30.0):
    """Sends `body` (bytes) to `method`; returns the answer's bytes.

    Raises:
      grpc.RpcError: if gRPC refused the call.
    """
    stub = self.channel.unary_unary(f'/{protocol.SERVICE}/{method}')
    return stub(body, timeout=timeout_s,
                metadata=self.metadata if metadata == 'own' else metadata)

  def call(self, method, request=None, **kwargs):
    """Sends `request` as JSON; returns the decoded answer: `{'result': ...}`
    or `{'error': {'type', 'message'}}`."""
    body = json.dumps({} if request is None else request).encode('utf-8')
    return json.loads(self.send(method, body, **kwargs))

  def result(self, method, request=None):
    """The result of a call that must succeed."""
    answer = self.call(method, request)
    assert 'result' in answer, (method, answer)
    return answer['result']

  def close(self):
    self.channel.close()


@pytest.fixture
def attacker_for():
  """`attacker_for(server, token)`: an `Attacker`, closed after the test;
  `token=True` presents the server's own token."""
  made = []

  def make(server, token=None):
    if token is True:
      token = _token(server)
    attacker = Attacker(server, token)
    made.append(attacker)
    return attacker

  yield make
  for attacker in made:
    attacker.close()


def _held(server):
  return tokens.read_token_file(server.token_file, what='the test')


def _token(server):
  return _held(server).token


def _client(server, data_spec):
  """A connected client-mode manager of `server`; returns `(manager,
  observer)`."""
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=server.manager.server_address,
      control_address=f'127.0.0.1:{server.control_port}',
      control_token_file=server.token_file, sample_timeout_s=5.0,
      write_timeout_s=5.0)
  _, observer = manager.connect()
  return manager, observer


def _write(server, data_spec, steps, seed):
  """Writes the items of a real actor's `steps` steps; returns their
  fingerprints."""
  manager, observer = _client(server, data_spec)
  try:
    record = testing.run_actor(observer, steps, seed=seed)
    observer.flush()
  finally:
    manager.close()
  return sorted(map(testing.item_fingerprint,
                    testing.expected_items(record.steps, 2)))


def _items(server):
  return server.manager.stats()['tables'][TABLE]['items']


def _ckpt_dir(server):
  return os.path.join(server.manager.checkpoint_dir, checkpoint_folders.CHECKPOINTS_DIR)


def _checkpoints(server):
  """{relative path: bytes} of every file of the buffer's checkpoints."""
  return testing.dir_digest(_ckpt_dir(server))


def _disk(server):
  """Every file of the buffer directory but the serving record (the server
  rewrites it as it serves)."""
  digest = testing.dir_digest(server.manager.checkpoint_dir)
  digest.pop(serving_record.RECORD_FILE, None)
  return digest


def _state(server, legit):
  """What an attack must not change: items, serving instance, checkpoints."""
  return {'items': _items(server),
          'instance': legit.result('info')['instance']['id'],
          'checkpoints': _checkpoints(server)}


def _refused(answer, kind, *needles):
  """Checks `answer` is the error `kind` naming each of `needles`; returns
  its message."""
  assert 'error' in answer, f'not refused: {answer}'
  error = answer['error']
  assert error['type'] == kind, error
  for needle in needles:
    assert needle in error['message'], (needle, error)
  return error['message']


def _record(coordinated_id, path, **changes):
  """A coordinated record of one shard naming `path` (schema-valid)."""
  record = {'id': coordinated_id, 'created_utc': '2026-11-26T00:00:00+00:00',
            'extra': {}, 'shards': [{'address': '127.0.0.1:1', 'path': path,
                                     'counts': {}}]}
  record.update(changes)
  return record


def _plant(server, content, name=None, mtime=None):
  """Writes a record file by hand into the buffer's `coordinated/` folder,
  as an attacker with access to the directory would; returns its path."""
  folder = os.path.join(server.manager.checkpoint_dir, coordinated_records.RECORDS_DIR)
  os.makedirs(folder, exist_ok=True)
  name = name or f'{content["id"]}.json'
  path = os.path.join(folder, name)
  with open(path, 'w') as f:
    f.write(content if isinstance(content, str) else json.dumps(content))
  if mtime is not None:
    os.utime(path, (mtime, mtime))
  return path


def _saved_and_committed(legit, coordinated_id=None, *, root=None):
  """A legitimate coordinated checkpoint of one shard (both phases);
  returns `(id, its checkpoint as answered)`. `root`: the buffer directory,
  to name the checkpoint in the record when answers show '<buffer>'."""
  coordinated_id = coordinated_id or coordinated_client.new_id()
  saved = legit.result('coordinated_save', {'id': coordinated_id})
  path = saved['path'] if root is None else saved['path'].replace(
      '<buffer>', root, 1)
  legit.result('coordinated_commit', {
      'record': _record(coordinated_id, path, shards=[{
          'address': '127.0.0.1:1', 'path': path,
          'counts': saved['counts']}]),
      'shard': 0})
  return coordinated_id, saved['path']


# --- F1: no token, no call. -------------------------------------------------


def test_calls_without_the_token_are_refused_and_change_nothing(
    server_for, attacker_for, data_spec):
  """F1: every method, without a token or with a wrong one, answers
  UNAUTHENTICATED before its handler runs; nothing on disk changes."""
  server = server_for()
  legit = attacker_for(server, token=True)
  _write(server, data_spec, 30, seed=1)
  server.checkpoint(reason='scheduled')
  real_id, tagged = _saved_and_committed(legit)
  _write(server, data_spec, 20, seed=2)  # Unsaved: a restore would drop them.
  before, disk = _state(server, legit), _disk(server)

  requests = {
      'info': {}, 'checkpoint': {'extra': {'by': 'attacker'}},
      'times_sampled': {},
      'coordinated_save': {'id': coordinated_client.new_id()},
      'coordinated_commit': {'record': _record(real_id, tagged), 'shard': 0},
      'coordinated_list': {}, 'coordinated_restore': {'id': real_id}}
  token = _token(server)
  credentials = {
      'no metadata': None,
      'empty': (('authorization', ''),),
      'wrong token': (('authorization', 'Bearer not-the-token'),),
      'token plus a byte': (('authorization', f'Bearer {token}x'),),
      'token prefix': (('authorization', f'Bearer {token[:-1]}'),),
      'no scheme': (('authorization', token),),
      'other scheme': (('authorization', f'Basic {token}'),),
      'other key': (('x-token', f'Bearer {token}'),)}
  attacker = attacker_for(server)
  assert set(requests) == set(METHODS)
  for method, request in requests.items():
    for what, metadata in credentials.items():
      with pytest.raises(grpc.RpcError) as refused:
        attacker.send(method, json.dumps(request).encode(), metadata=metadata)
      assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, (
          method, what, refused.value.details())
      assert 'token' in refused.value.details()

  assert _state(server, legit) == before
  assert _disk(server) == disk
  # The project's client says what is wrong and where it looked.
  certificate = _held(server).certificate
  client = control_client.ControlClient(
      f'127.0.0.1:{server.control_port}',
      credentials=credentials_lib.ClientCredentials(
          looked='nowhere at all', channel_credentials=grpc
          .ssl_channel_credentials(certificate),
          channel_options=tuple(certificates.channel_options(certificate))))
  with pytest.raises(smart_replay.AuthenticationError,
                     match='control.token.*looked in: nowhere at all'):
    client.call('info', timeout_s=10)
  client.close()


# --- F2: rollback, other buffers, arbitrary paths. --------------------------


@pytest.mark.parametrize('auth', [True, False], ids=['with_token', 'auth_off'])
def test_rollback_to_an_older_own_checkpoint_is_refused(
    server_for, attacker_for, data_spec, auth):
  """F2.1/F2.2: a record naming the buffer's own empty ckpt-000001, then a
  restore: both refused; the items, saved or not, stay."""
  server = server_for(auth=auth)
  attacker = attacker_for(server, token=True if auth else None)
  empty = server.checkpoint(reason='scheduled')
  assert os.path.basename(empty) == 'ckpt-000001'
  _write(server, data_spec, 30, seed=1)
  server.checkpoint(reason='scheduled')
  _write(server, data_spec, 20, seed=2)
  before = _state(server, attacker)
  assert before['items'] == 48

  for path in (empty, os.path.join(_ckpt_dir(server), 'ckpt-000002'),
               os.path.relpath(empty)):
    coordinated_id = coordinated_client.new_id()
    _refused(attacker.call('coordinated_commit', {
        'record': _record(coordinated_id, path), 'shard': 0}),
             'CheckpointNotFoundError', 'holds no checkpoint tagged with it',
             'coordinated_save')
    _refused(attacker.call('coordinated_restore', {'id': coordinated_id}),
             'CheckpointNotFoundError', 'no record', coordinated_id)
    # A record planted on disk by hand does not name what is restored.
    _plant(server, dict(_record(coordinated_id, path), shard=0))
    _refused(attacker.call('coordinated_restore', {'id': coordinated_id}),
             'CheckpointNotFoundError', 'no longer holds')
  # Nor can a plain checkpoint tag itself as a coordinated one.
  _refused(attacker.call('checkpoint', {'extra': {
      coordinated_records.EXTRA_KEY: coordinated_id}}), 'ValueError',
           coordinated_records.EXTRA_KEY)

  assert _state(server, attacker) == before
  assert not os.path.exists(os.path.join(_ckpt_dir(server), 'ckpt-000003'))


def test_another_buffer_on_the_host_is_never_loaded(
    server_for, attacker_for, data_spec):
  """F2.5: records (committed, or planted on disk) naming another buffer's
  checkpoint, and a link to it in our checkpoints/: every restore refused;
  we serve our own items only."""
  ours, other = server_for('ours'), server_for('other')
  attacker = attacker_for(ours, token=True)
  mine = _write(ours, data_spec, 20, seed=1)  # Unsaved, no checkpoint yet.
  _write(other, data_spec, 50, seed=2)
  coordinated_id, theirs = _saved_and_committed(attacker_for(other, True))
  assert os.path.isdir(theirs)
  before, their_disk = _state(ours, attacker), _disk(other)
  assert before['items'] == 19

  _refused(attacker.call('coordinated_commit', {
      'record': _record(coordinated_id, theirs), 'shard': 0}),
           'CheckpointNotFoundError', 'holds no checkpoint tagged with it')
  _plant(ours, dict(_record(coordinated_id, theirs), shard=0))
  _refused(attacker.call('coordinated_restore', {'id': coordinated_id}),
           'CheckpointNotFoundError', 'no longer holds')
  # A link inside our checkpoints/ to their checkpoint (tagged with the id)
  # is not one of ours either.
  os.makedirs(_ckpt_dir(ours), exist_ok=True)
  link = os.path.join(_ckpt_dir(ours), 'ckpt-000099')
  os.symlink(theirs, link)
  try:
    _refused(attacker.call('coordinated_restore', {'id': coordinated_id}),
             'CheckpointNotFoundError', 'no longer holds')
    assert attacker.result('coordinated_list')['usable'] == []
  finally:
    os.remove(link)
  # Below the network: the server itself refuses to reload their folder.
  with pytest.raises(smart_replay.CheckpointNotFoundError,
                     match='not one of the checkpoints of this buffer'):
    ours.reload(theirs, reason='attack')
  # Even once we hold a checkpoint tagged with the same id, a record must
  # name ours, not theirs.
  attacker.result('coordinated_save', {'id': coordinated_id})
  _refused(attacker.call('coordinated_commit', {
      'record': _record(coordinated_id, theirs), 'shard': 0}),
           'CheckpointNotFoundError', 'holds no checkpoint tagged with it')

  after = _state(ours, attacker)
  assert (after['items'], after['instance']) == (before['items'],
                                                before['instance'])
  assert _disk(other) == their_disk
  client, _ = _client(ours, data_spec)
  try:
    assert sorted(testing.sample_all_items(client).values()) == mine
  finally:
    client.close()


ARBITRARY_PATHS = ('/etc', '../../etc', '/proc/self', '/root', '/etc/passwd',
                   '/nonexistent_dir_xyz', '../../nonexistent_dir_xyz')


def test_arbitrary_paths_are_refused_before_anything_stops_and_alike(
    server_for, attacker_for, data_spec):
  """F2.3/F2.4: records naming /etc, ../../etc, /proc/self... are refused
  without restarting Reverb (same instance, unsaved items kept), and an
  existing directory answers exactly as a missing one (no oracle)."""
  server = server_for(auth=False)
  attacker = attacker_for(server)
  _write(server, data_spec, 30, seed=1)
  server.checkpoint(reason='scheduled')
  _write(server, data_spec, 20, seed=2)  # Unsaved.
  before = _state(server, attacker)

  answers = {}
  for path in ARBITRARY_PATHS:
    coordinated_id = coordinated_client.new_id()

    def shape(message, path=path, coordinated_id=coordinated_id):
      return (message.replace(repr(path), '<path>').replace(path, '<path>')
              .replace(coordinated_id, '<id>'))

    commit = _refused(attacker.call('coordinated_commit', {
        'record': _record(coordinated_id, path), 'shard': 0}),
                      'CheckpointNotFoundError')
    _plant(server, dict(_record(coordinated_id, path), shard=0))
    restore = _refused(attacker.call('coordinated_restore',
                                     {'id': coordinated_id}),
                       'CheckpointNotFoundError')
    with pytest.raises(smart_replay.CheckpointNotFoundError) as reload:
      server.reload(path, reason='attack')
    answers[path] = (shape(commit), shape(restore), shape(str(reload.value)))
  assert len(set(answers.values())) == 1, answers
  assert 'nothing was changed' in next(iter(answers.values()))[2]

  assert _state(server, attacker) == before
  assert attacker.result('coordinated_list')['usable'] == []


def test_a_fresh_server_without_a_checkpoint_survives_a_bad_restore(
    server_for, attacker_for, data_spec):
  """F3: a server that never checkpointed gets a record naming /etc and a
  restore: refused; it keeps serving (writes, samples, polls) and its final
  checkpoint holds every item."""
  server = server_for(auth=False)
  attacker = attacker_for(server)
  _write(server, data_spec, 30, seed=1)
  before = _state(server, attacker)
  assert before['items'] == 29 and not server.manager.existing_checkpoints()

  coordinated_id = coordinated_client.new_id()
  _refused(attacker.call('coordinated_commit', {
      'record': _record(coordinated_id, '/etc'), 'shard': 0}),
           'CheckpointNotFoundError')
  _plant(server, dict(_record(coordinated_id, '/etc'), shard=0))
  _refused(attacker.call('coordinated_restore', {'id': coordinated_id}),
           'CheckpointNotFoundError')
  with pytest.raises(smart_replay.CheckpointNotFoundError):
    server.reload('/etc', reason='attack')
  assert _state(server, attacker) == before
  assert server.poll() is None  # Not broken: a broken server raises here.

  _write(server, data_spec, 20, seed=2)
  assert _items(server) == 48
  client, _ = _client(server, data_spec)
  try:
    assert len(testing.sample_all_items(client)) == 48
  finally:
    client.close()
  polls = []
  final = server.serve_until(lambda: polls.append(1) or len(polls) > 3,
                             poll_s=0.01)
  assert checkpoint_folders.verify(final)['counts']['tables'][TABLE]['items'] == 48


# --- F4: far-future ids. -----------------------------------------------------


def test_far_future_ids_are_refused(server_for, attacker_for, data_spec):
  """F4: coordinated_save and coordinated_commit with an id of the year 9999
  are refused; no checkpoint or record is written."""
  server = server_for()
  attacker = attacker_for(server, token=True)
  _write(server, data_spec, 20, seed=1)
  _, tagged = _saved_and_committed(attacker)
  before, disk = _state(server, attacker), _disk(server)

  _refused(attacker.call('coordinated_save', {'id': FAR_FUTURE_ID}),
           'ValueError', FAR_FUTURE_ID, 'later than')
  _refused(attacker.call('coordinated_commit', {
      'record': _record(FAR_FUTURE_ID, tagged), 'shard': 0}),
           'ValueError', 'id', 'no later than')
  _refused(attacker.call('coordinated_restore', {'id': FAR_FUTURE_ID}),
           'CheckpointNotFoundError', 'no record')
  assert _state(server, attacker) == before
  assert _disk(server) == disk


@pytest.mark.parametrize('stamp', ['no_stamp', 'stamp_now', 'future_mtime',
                                   'far_future_stamp'])
def test_planted_far_future_records_neither_push_out_nor_hijack(
    server_for, attacker_for, data_spec, tmp_path, stamp):
  """F4: 20 far-future records written by hand into a shard's coordinated/
  (with the server's write-time stamp left out, forged, or the file's mtime
  set ahead) are skipped by coordinated_list, do not prune the real record,
  and the project's own sharded restore picks the real coordinated
  checkpoint."""
  token_file, identity = in_process_shards.shared_credentials(str(tmp_path))
  shards = [server_for(f'shard{k}', token_file=token_file,
                       tls_cert_file=identity, tls_key_file=identity)
            for k in range(2)]
  addresses = [s.manager.server_address for s in shards]
  attacker = attacker_for(shards[0], token=True)
  saved = [len(_write(s, data_spec, 30, seed=k)) for k, s in enumerate(shards)]
  for k in range(coordinated_records.KEEP_RECORDS):
    record = dict(_record(f'99991231T235959999999Z-{k:08x}', '/etc'), shard=0)
    if stamp == 'far_future_stamp':
      record['recorded_unix'] = 253402300799.0  # 9999-12-31T23:59:59Z.
    elif stamp == 'stamp_now':
      record['recorded_unix'] = time.time()
    _plant(shards[0], record, mtime=(
        4102444800 if stamp == 'future_mtime' else None))  # Year 2100.

  def sharded_client():
    return smart_replay.ReplayBufferManager(
        data_spec=data_spec, server_address=addresses,
        control_token_file=token_file, sample_timeout_s=5.0,
        write_timeout_s=5.0)

  learner = sharded_client()
  learner.connect()
  try:
    line = learner.checkpoint().splitlines()[0]
  finally:
    learner.close()
  assert line.startswith('coordinated ')
  real_id = line.split()[-1]
  folder = os.path.join(shards[0].manager.checkpoint_dir,
                        coordinated_records.RECORDS_DIR)
  assert os.path.exists(os.path.join(folder, f'{real_id}.json')), (
      f'the real record {real_id} was pruned at its own commit by '
      f'{coordinated_records.KEEP_RECORDS} planted far-future records ({stamp}); '
      f'left: {sorted(os.listdir(folder))}')
  listing = attacker.result('coordinated_list')
  assert [r['id'] for r in listing['records']] == [real_id]
  assert listing['usable'] == [real_id]

  for k, shard in enumerate(shards):  # Newer, unsaved: the restore drops them.
    _write(shard, data_spec, 20, seed=k + 2)
  restorer = sharded_client()
  try:
    restorer.load_replay_buffer()
    assert restorer.loaded_checkpoint == line
  finally:
    restorer.close()
  assert [_items(s) for s in shards] == saved


# --- F5: poisoned records. ---------------------------------------------------


def test_poisoned_records_are_refused_and_skipped(
    server_for, attacker_for, data_spec, caplog):
  """F5: records with shard 7, shards as a string or a dict (and other
  wrong fields) are refused naming the field; the same written by hand are
  skipped with a warning, and coordinated_list still answers."""
  caplog.set_level(logging.WARNING)
  server = server_for()
  attacker = attacker_for(server, token=True)
  _write(server, data_spec, 20, seed=1)
  real_id, tagged = _saved_and_committed(attacker)
  before, disk = _state(server, attacker), _disk(server)

  good = _record(real_id, tagged)
  entry = good['shards'][0]
  poisons = {
      'shard 7': ({}, 7, 'shard must be'),
      'shard -1': ({}, -1, 'shard must be'),
      'shard a string': ({}, 'abc', 'shard must be'),
      'shard a bool': ({}, True, 'shard must be'),
      'shards a string': ({'shards': 'xyz'}, 0, 'shards must be'),
      'shards a dict': ({'shards': {'0': entry}}, 0, 'shards must be'),
      'shards empty': ({'shards': []}, 0, 'shards must be'),
      'an entry a string': ({'shards': ['xyz']}, 0, 'shards[0] must be'),
      'a path a number': ({'shards': [dict(entry, path=5)]}, 0,
                          'shards[0].path must be'),
      'counts a list': ({'shards': [dict(entry, counts=[])]}, 0,
                        'shards[0].counts must be'),
      'extra a list': ({'extra': []}, 0, 'extra must be'),
      'created_utc a number': ({'created_utc': 5}, 0, 'created_utc must be'),
      'recorded_unix a string': ({'recorded_unix': 'x'}, 0,
                                 'recorded_unix must be'),
  }
  for what, (changes, shard, field) in poisons.items():
    answer = attacker.call('coordinated_commit', {
        'record': dict(good, **changes), 'shard': shard})
    assert answer.get('error', {}).get('type') == 'ValueError', (what, answer)
    assert field in answer['error']['message'], (what, answer)
  for record in ('a string', ['a', 'list'], None):
    _refused(attacker.call('coordinated_commit', {'record': record,
                                                   'shard': 0}),
             'ValueError', 'record must be a JSON object')
  assert _disk(server) == disk

  caplog.clear()
  now_id = coordinated_client.new_id
  files = [
      _plant(server, {'id': now_id(), 'shards': [{'path': 'x'}],
                      'shard': 7}),  # The review's record.
      _plant(server, dict(_record(now_id(), tagged), shards='xyz', shard=0)),
      _plant(server, dict(_record(now_id(), tagged), shards={'0': entry},
                          shard=0)),
      _plant(server, '{"id": "not json', name=f'{now_id()}.json'),
      _plant(server, '["a", "list"]', name=f'{now_id()}.json'),
      _plant(server, '\xff\xfe', name=f'{now_id()}.json'),
      _plant(server, dict(_record(real_id, tagged), shard=0),
             name=f'{now_id()}.json')]  # Another id than its file name.
  listing = attacker.result('coordinated_list')
  assert [r['id'] for r in listing['records']] == [real_id]
  assert listing['usable'] == [real_id]
  warned = ' '.join(r.getMessage() for r in caplog.records
                    if r.levelno == logging.WARNING)
  for path in files:
    assert f'Skipping the coordinated record {path}' in warned
  assert _state(server, attacker) == before


# --- F6: sizes. --------------------------------------------------------------


def test_oversized_requests_are_refused(server_for, attacker_for, data_spec):
  """F6: a 2 MiB body is refused by gRPC (RESOURCE_EXHAUSTED, the handler
  never runs); a 100 KiB `extra` and a 300 KiB record by the handlers, naming
  the limit; no manifest or record is written."""
  server = server_for()
  attacker = attacker_for(server, token=True)
  _write(server, data_spec, 20, seed=1)
  _, tagged = _saved_and_committed(attacker)
  before, disk = _state(server, attacker), _disk(server)

  blob = 'x' * (2 << 20)
  for method, request in (
      ('checkpoint', {'extra': {'blob': blob}}),
      ('coordinated_save', {'id': coordinated_client.new_id(),
                            'extra': {'blob': blob}}),
      ('coordinated_commit', {'record': _record(
          coordinated_client.new_id(), tagged, extra={'blob': blob}),
                              'shard': 0}),
      ('info', {'blob': blob})):
    for metadata in ('own', None):
      with pytest.raises(grpc.RpcError) as refused:
        attacker.call(method, request, metadata=metadata)
      code = refused.value.code()
      assert code == grpc.StatusCode.RESOURCE_EXHAUSTED or (
          metadata is None and code == grpc.StatusCode.UNAUTHENTICATED), (
              method, code, refused.value.details())

  extra = {'blob': 'x' * (100 << 10)}
  _refused(attacker.call('checkpoint', {'extra': extra}), 'ValueError',
           f'at most {handlers.MAX_EXTRA_BYTES} bytes')
  assert handlers.MAX_EXTRA_BYTES == 64 << 10
  _refused(attacker.call('coordinated_save', {
      'id': coordinated_client.new_id(), 'extra': extra}),
           'ValueError', f'at most {handlers.MAX_EXTRA_BYTES} bytes')
  _refused(attacker.call('coordinated_commit', {
      'record': _record(coordinated_client.new_id(), tagged,
                        extra={'blob': 'x' * (300 << 10)}), 'shard': 0}),
           'ValueError', f'at most {coordinated_records.MAX_RECORD_BYTES}')
  assert _state(server, attacker) == before
  assert _disk(server) == disk


# --- F6/F7: a flood of checkpoints. -----------------------------------------


def test_a_checkpoint_flood_neither_queues_info_nor_prunes_own_checkpoints(
    server_for, attacker_for, data_spec):
  """F6/F7: 30 threads making 2 authenticated `checkpoint` calls each (each a
  distinct `extra`, so none coalesce): each succeeds or answers
  ServerBusyError;
  `info` answers quickly meanwhile; the server's own checkpoints and the
  coordinated ones survive the flood's retention."""
  server = server_for()
  attacker = attacker_for(server, token=True)
  _write(server, data_spec, 30, seed=1)
  own = [server.checkpoint(reason='scheduled')]
  _write(server, data_spec, 10, seed=2)
  own.append(server.checkpoint(reason='final'))
  _, tagged = _saved_and_committed(attacker)
  items = _items(server)
  keep = server.manager.keep_checkpoints

  # Over gRPC's cap on calls at once, and (saves start 1 s apart) about a
  # dozen saves, several times what retention keeps: 20 s of flood.
  flooders, rounds, start = 30, 2, threading.Barrier(31)

  def checkpoint(k, n):
    try:
      return attacker.call('checkpoint', {'extra': {'flood': k, 'round': n}})
    except grpc.RpcError as e:  # gRPC's cap on calls at once, unread.
      assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
      assert 'Concurrent RPC limit' in e.details(), e
      return {'error': {'type': 'ServerBusyError',
                        'message': 'Try again later (gRPC)'}}

  def flood(k):
    start.wait(timeout=30)
    return [checkpoint(k, n) for n in range(rounds)]

  with concurrent.futures.ThreadPoolExecutor(flooders) as pool:
    futures = [pool.submit(flood, k) for k in range(flooders)]
    start.wait(timeout=30)
    began, info_s = time.monotonic(), []
    while not all(f.done() for f in futures) or not info_s:
      t = time.monotonic()
      try:
        assert attacker.result('info')['config']['capacity'] == 200
        info_s.append(time.monotonic() - t)
      except grpc.RpcError as e:  # Over gRPC's cap at that instant.
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
      assert time.monotonic() - began < 60, 'the flood did not end in 60 s'
    flood_s = time.monotonic() - began
    answers = [a for f in futures for a in f.result()]

  kinds = [a['error']['type'] if 'error' in a else 'ok' for a in answers]
  assert set(kinds) <= {'ok', 'ServerBusyError'}, answers
  assert kinds.count('ok') >= 1 and len(kinds) == flooders * rounds
  # `info` never waits for the checkpoints: well under the flood's time.
  assert max(info_s) < min(2.0, flood_s / 2), (max(info_s), flood_s, kinds)
  for answer in answers:
    if 'error' in answer:
      assert 'Try again later' in answer['error']['message']

  groups = {}
  for path in server.manager.existing_checkpoints():
    manifest = checkpoint_folders.verify(path)
    groups.setdefault(coordinated_records.retention_group(manifest), []).append(path)
    if coordinated_records.retention_group(manifest) == 'requested':
      assert manifest['extra'][coordinated_records.REQUESTED_KEY] is True
  assert groups['own'] == own
  assert groups['coordinated'] == [tagged]
  assert 1 <= len(groups['requested']) <= keep
  assert _items(server) == items


# --- F8: times_sampled racing with checkpoints. -----------------------------


def test_times_sampled_racing_with_checkpoints_all_succeed(
    server_for, data_spec):
  """F8: 2 threads calling checkpoint and 2 calling times_sampled, 3 calls
  each, with the token: every call succeeds (the client retries busy
  answers), and every times_sampled lists every item."""
  server = server_for()
  _write(server, data_spec, 30, seed=1)
  items = _items(server)
  client = control_client.ControlClient(
      f'127.0.0.1:{server.control_port}',
      credentials=credentials_lib.ClientCredentials.resolve(
          token_file=server.token_file, environ={}))

  calls = 3  # Saves start 1 s apart: 6 s of checkpoints.

  def checkpoints(k):
    return [client.call('checkpoint', {'extra': {'thread': k, 'call': n}},
                        timeout_s=60) for n in range(calls)]

  def times_sampled():
    return [client.call('times_sampled', timeout_s=60) for _ in range(calls)]

  try:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      futures = [pool.submit(checkpoints, 0), pool.submit(checkpoints, 1),
                 pool.submit(times_sampled), pool.submit(times_sampled)]
      results = [f.result(timeout=120) for f in futures]
  finally:
    client.close()
  for paths in results[:2]:
    assert len(paths) == calls and all(isinstance(p, str) for p in paths)
  for answers in results[2:]:
    assert [len(a[TABLE]) for a in answers] == [items] * calls
  assert _items(server) == items


# --- F10: malformed requests. ------------------------------------------------


def _flood_lines(caplog):
  """Log records of the control service and grpcio (WARNING and up)."""
  return [r for r in caplog.records if r.levelno >= logging.WARNING and
          (r.name.startswith('grpc') or 'Control service' in r.getMessage())]


def test_malformed_requests_get_a_clean_error_and_one_log_line(
    server_for, attacker_for, caplog):
  """F10: 200 one-byte requests (and other malformed bodies) each get a
  clean 'bad request' ValueError; the log gets at most a couple of lines,
  no traceback. Without the token they are refused the same way."""
  caplog.set_level(logging.INFO)
  server = server_for()
  attacker = attacker_for(server, token=True)
  caplog.clear()
  bodies = [b'x'] * 200 + [b'', b'\xff', b'\xc3', b'null', b'[1]', b'"s"',
                           b'1', b'{', b'{"a": }', b'NaN']
  for k, body in enumerate(bodies):
    method = METHODS[k % len(METHODS)]
    answer = json.loads(attacker.send(method, body))
    _refused(answer, 'ValueError', 'bad request', 'send a JSON object')
  lines = _flood_lines(caplog)
  assert len(lines) <= 2, [r.getMessage() for r in lines]
  assert 'malformed requests' in lines[0].getMessage()  # Captured: counted.
  assert not any(r.exc_info for r in caplog.records)
  assert 'Traceback' not in caplog.text

  caplog.clear()
  for _ in range(200):
    with pytest.raises(grpc.RpcError) as refused:
      attacker.send('info', b'x', metadata=None)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
  lines = _flood_lines(caplog)
  assert len(lines) <= 2, [r.getMessage() for r in lines]
  assert 'without a valid token' in lines[0].getMessage()
  assert 'Traceback' not in caplog.text
  assert attacker.result('info')['config']['capacity'] == 200


def test_deeply_nested_json_gets_a_clean_error_and_one_log_line(
    server_for, attacker_for, caplog):
  """F10: 20 requests of 100,000 '[' (100 KB, under the 1 MiB limit): each a
  clean error, at most a couple of log lines, no traceback."""
  caplog.set_level(logging.INFO)
  server = server_for()
  attacker = attacker_for(server, token=True)
  caplog.clear()
  for _ in range(20):
    try:
      answer = json.loads(attacker.send('info', b'[' * 100_000))
    except grpc.RpcError as e:
      answer = {'grpc': e.code().name, 'details': e.details()}
    _refused(answer, 'ValueError', 'bad request')
  lines = _flood_lines(caplog)
  assert len(lines) <= 2, [r.getMessage() for r in lines][:3]
  assert 'Traceback' not in caplog.text
  assert attacker.result('info')['config']['capacity'] == 200


# --- F9: ids that only look valid. ------------------------------------------


BAD_IDS = ('20261126T000000Z-0a1b2c3d\n', '20261126T000000Z-0a1b2c3d\r',
           ' 20261126T000000Z-0a1b2c3d', '20261126T000000Z-0A1B2C3D',
           '20200101T000000\u0661Z-0a1b2c3d',  # An Arabic-Indic digit.
           '20200101T000000\uff11Z-0a1b2c3d',  # A fullwidth digit.
           '20261126T000000Z-0a1b2c3d/../../x', '../../etc', '', 'x' * 10_000,
           None, 20261126, ['20261126T000000Z-0a1b2c3d'])


def test_ids_that_only_look_valid_are_refused(
    server_for, attacker_for, data_spec):
  """F9: an id with a trailing newline (or other white space, capitals,
  non-ASCII digits, a path, not a string) is refused by coordinated_save,
  coordinated_commit and coordinated_restore; nothing is written."""
  server = server_for()
  attacker = attacker_for(server, token=True)
  _write(server, data_spec, 20, seed=1)
  _, tagged = _saved_and_committed(attacker)
  before, disk = _state(server, attacker), _disk(server)

  accepted = []
  for bad in BAD_IDS:
    for method, request in (
        ('coordinated_save', {'id': bad}),
        ('coordinated_commit', {'record': _record(bad, tagged),
                                'shard': 0}),
        ('coordinated_restore', {'id': bad})):
      answer = attacker.call(method, request)
      if answer.get('error', {}).get('type') != 'ValueError':
        accepted.append((bad, method, answer))
      else:
        assert 'looks like' in answer['error']['message'], answer
        assert len(answer['error']['message']) < 400
  assert not accepted, f'ids accepted: {accepted}'
  assert _state(server, attacker) == before
  assert _disk(server) == disk


# --- F7: reserved keys of `extra`. ------------------------------------------


def test_reserved_extra_keys_are_refused(server_for, attacker_for, data_spec):
  """F7: `extra` may not set the coordinated tag or the requested mark (nor
  be anything but a JSON object), in checkpoint or coordinated_save."""
  server = server_for()
  attacker = attacker_for(server, token=True)
  _write(server, data_spec, 20, seed=1)
  before, disk = _state(server, attacker), _disk(server)

  for method in ('checkpoint', 'coordinated_save'):
    def call(extra, method=method):
      return attacker.call(method, {'id': coordinated_client.new_id(),
                                    'extra': extra})
    for key, value in ((coordinated_records.EXTRA_KEY, coordinated_client.new_id()),
                       (coordinated_records.REQUESTED_KEY, False),
                       (coordinated_records.REQUESTED_KEY, True)):
      _refused(call({key: value, 'train_step': 7}), 'ValueError',
               'must not set', key)
    for extra in ('a string', ['a', 'list'], 5):
      _refused(call(extra), 'ValueError', 'extra must be a JSON object')
  assert _state(server, attacker) == before
  assert _disk(server) == disk


# --- F11: disclosure. --------------------------------------------------------


def test_without_a_token_answers_disclose_no_paths_pids_or_hosts(
    server_for, attacker_for, data_spec, caplog, monkeypatch):
  """F11: with auth off, `info` (after a crash of the previous server) and
  answers and errors carry no absolute buffer path ('<buffer>' instead), no
  previous pid or host; an unexpected internal error answers an incident id
  only, which the server's log explains."""
  first = server_for('buffer', auth=False)
  _write(first, data_spec, 30, seed=1)
  first.checkpoint(reason='scheduled')
  _write(first, data_spec, 10, seed=2)
  first.close(final_checkpoint=False)  # As a crash: 9 items lost.
  root = first.manager.checkpoint_dir

  server = server_for('buffer', auth=False)
  attacker = attacker_for(server)
  assert server.restart_loss and server.restart_loss['previous_pid']
  info = attacker.result('info')
  text = json.dumps(info)
  assert info['checkpoint_dir'] == '<buffer>'
  assert root not in text and os.path.realpath(root) not in text
  assert all(p.startswith('<buffer>/') for p in info['checkpoints'])
  loss = info['instance']['restart_loss']
  assert loss['lost_items'] == 9 and loss['cause'] == 'crash'
  assert 'previous_pid' not in loss and 'previous_host' not in loss
  host = socket.gethostname()
  if len(host) >= 6:
    assert host not in text

  real_id, tagged = _saved_and_committed(attacker, root=root)
  assert tagged.startswith('<buffer>/checkpoints/ckpt-')
  listing = json.dumps(attacker.result('coordinated_list'))
  assert root not in listing
  # An error about a file of the buffer names it relative to '<buffer>'.
  data = [n for n in os.listdir(os.path.join(root, tagged[len('<buffer>/'):]))
          if n.endswith('.tfrecord')]
  with open(os.path.join(root, tagged[len('<buffer>/'):], data[0]),
            'r+b') as f:
    f.seek(0)
    byte = f.read(1)
    f.seek(0)
    f.write(bytes([byte[0] ^ 0xff]))
  before = _state(server, attacker)
  message = _refused(attacker.call('coordinated_restore', {'id': real_id}),
                     'CheckpointCorruptError')
  assert root not in message and os.path.realpath(root) not in message
  assert _state(server, attacker) == before  # Checked before it stopped.

  # An unexpected failure inside the server: an incident id only.
  caplog.set_level(logging.WARNING)
  secret = os.path.join(root, 'secret-file')
  with monkeypatch.context() as patch:
    def fails(*args, **kwargs):
      raise KeyError(f'{secret} at pid {os.getpid()}')
    patch.setattr(server.manager, 'stats', fails)
    answer = attacker.call('times_sampled')
  message = _refused(answer, 'RuntimeError', 'incident')
  incident = message.split('incident ')[1].split()[0]
  assert 'KeyError' not in message and secret not in message
  assert 'secret-file' not in message and str(os.getpid()) not in message
  logged = [r.getMessage() for r in caplog.records if incident in
            r.getMessage()]
  assert logged and 'KeyError' in logged[0]
  assert attacker.result('info')['instance']['id'] == before['instance']


def test_redaction_covers_a_buffer_reached_through_a_link(
    server_for, attacker_for, data_spec, tmp_path):
  """F11: with auth off and the buffer's directory given through a symbolic
  link, no answer of a coordinated save, commit, list or restore names the
  directory, as given or resolved."""
  os.makedirs(tmp_path / 'real')
  os.symlink(tmp_path / 'real', tmp_path / 'link')
  server = server_for(os.path.join('link', 'buffer'), auth=False)
  attacker = attacker_for(server)
  _write(server, data_spec, 20, seed=1)
  root = server.manager.checkpoint_dir
  assert root.startswith(str(tmp_path / 'link'))
  coordinated_id, _ = _saved_and_committed(attacker, root=root)
  answers = [attacker.call('coordinated_list'), attacker.call('info'),
             attacker.call('coordinated_restore', {'id': coordinated_id}),
             attacker.call('info')]
  assert 'result' in answers[2], answers[2]
  for answer in answers:
    assert str(tmp_path) not in json.dumps(answer), answer


def test_coordinated_checkpoints_still_work_without_a_token(
    server_for, data_spec):
  """F11's redaction must not break the protocol: with auth off, a sharded
  client's coordinated checkpoint (whose record names each shard's
  checkpoint as the shard answered it) is written and restored."""
  shards = [server_for(f'shard{k}', auth=False) for k in range(2)]
  saved = [len(_write(s, data_spec, 20, seed=k)) for k, s in enumerate(shards)]
  learner = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=[s.manager.server_address
                                           for s in shards],
      sample_timeout_s=5.0, write_timeout_s=5.0)
  learner.connect()
  try:
    line = learner.checkpoint().splitlines()[0]
    assert line.startswith('coordinated ')
  finally:
    learner.close()
  for k, shard in enumerate(shards):
    _write(shard, data_spec, 10, seed=k + 2)
  restorer = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=[s.manager.server_address
                                           for s in shards])
  try:
    restorer.load_replay_buffer()
    assert restorer.loaded_checkpoint == line
  finally:
    restorer.close()
  assert [_items(s) for s in shards] == saved
