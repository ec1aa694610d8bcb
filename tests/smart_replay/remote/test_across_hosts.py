"""A buffer server across hosts: network namespaces as the hosts.

Every test runs real `smart-replay-serve` processes in a server namespace
(10.254.77.1) and real clients in a client namespace (10.254.77.2, and
10.254.77.3 for the firewall), joined by a veth pair (`netns.hosts`):

- the control service and Reverb's port on their default address
  (127.0.0.1) cannot be reached from the other host, and can from their
  own;
- with Reverb (`--reverb_host`) and the control service bound to the
  link's address and a token, the control service refuses a client without
  the token (or with a wrong one) with `AuthenticationError` naming where
  the client looked, and serves one with it (a file given, or
  `$SMART_REPLAY_CONTROL_TOKEN_FILE`): it connects, writes and samples;
  Reverb listens on that address only, and the server still reaches its
  own port (checkpoints);
- a buffer of three shards on the server host (Reverb on the link's
  address, one shard on every interface), three actors and a learner on
  the client host: they write, sample, take a coordinated checkpoint,
  write more, restore it, and sample again; every shard holds what the
  checkpoint record says, and each actor counts what the restore dropped;
- Reverb's port on every interface (`--reverb_host=0.0.0.0`: IPv4 and
  IPv6) is closed to every address but the allowed client's by an nftables
  rule set in the server's namespace (the shape of docs/remote.md's Security
  rule, with loopback kept open and IPv6 dropped too); the allowed client
  still writes, and the server still checkpoints.

Clients run this file as a program (`python -m
tests.smart_replay.remote.test_across_hosts ROLE ARGS_JSON`, see `_ROLES`)
and write their reports as JSON files; the test and its workers wait for
each other through files in the test's directory, each wait with a
deadline. The tests skip, saying why, when network namespaces cannot be
made (not root, no `ip`, no permission) and the firewall test without `nft`.
"""

import json
import os
import sys
import time

from smart_replay.control import certificates
from smart_replay.control import credentials
from smart_replay.control import tokens
from tests.smart_replay.remote import in_process_shards
from tests.smart_replay.remote import netns
from tests.smart_replay.remote.netns import hosts  # pylint: disable=unused-import

SERVER, CLIENT, OTHER = (netns.SERVER_ADDRESS, netns.CLIENT_ADDRESS,
                         netns.OTHER_CLIENT_ADDRESS)
TOKEN_ENV = credentials.TOKEN_ENV
TOKEN_FILE_ENV = credentials.TOKEN_FILE_ENV
PORT = 8000  # Each namespace has its own ports: fixed ones are free.
SHARD_PORTS = (8000, 8010, 8020)
ACTORS, STEPS = 3, 40
START_S = 120  # A process importing TensorFlow on a busy 2-core machine.
WORK_S = 120


# ------------------------------------------------------------------ helpers

def _serve_argv():
  """`smart-replay-serve` of the tests' environment (the console script
  beside its python; `python -m` of the same entry point without it)."""
  script = os.path.join(os.path.dirname(sys.executable), 'smart-replay-serve')
  if os.access(script, os.X_OK):
    return [script]
  return [sys.executable, '-m', 'smart_replay_scripts.serve']


def _spec_file(tmp_path):
  from smart_replay.spec import specs  # pylint: disable=g-import-not-at-top
  from tests.smart_replay.remote import remote_workers  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / 'spec.pbtxt')
  if not os.path.exists(path):
    specs.save_spec(path, remote_workers.data_spec())
  return path


def _identity(folder):
  """The TLS identity (key and certificate) the tests' servers share."""
  return in_process_shards.shared_credentials(str(folder))[1]


def _serve(namespace, tmp_path, name, port, *flags):
  """Starts `smart-replay-serve` in `namespace` (not waiting for it), with
  the tests' shared TLS identity."""
  identity = _identity(tmp_path)
  return namespace.start(
      _serve_argv() + [
          f'--spec_file={_spec_file(tmp_path)}',
          f'--checkpoint_dir={tmp_path / name}', f'--port={port}',
          '--capacity=10000', '--gin_bindings=ReplayServer.log_every_s=1.0',
          f'--control_tls_cert_file={identity}',
          f'--control_tls_key_file={identity}', *flags], name)


def _serving(*servers):
  for server in servers:
    server.wait_for('Serving ', START_S)
  return servers


def _token_file(path):
  """A control token file (mode 0600) with a fresh secret and the shared
  certificate of the tests' servers (`_identity`)."""
  with open(_identity(path.parent), 'rb') as f:
    certificate = certificates.split_certificates(f.read())[1][0]
  tokens.new_token_file(str(path), certificate=certificate)
  return str(path)


def _client_env(**extra):
  """A client's environment: the tests', without any control token."""
  return netns.child_environment(extra, drop=(TOKEN_ENV, TOKEN_FILE_ENV))


def _start_worker(namespace, role, label, env=None, **args):
  """Runs `role` of this file (`_ROLES`) as a process in `namespace`."""
  return namespace.start(
      namespace.python_argv('-m', __spec__.name if __spec__ else
                            'tests.smart_replay.remote.test_across_hosts',
                            role, json.dumps(args)),
      label, env=env or _client_env())


def _report(path, processes, timeout_s=WORK_S):
  """Waits for a worker's JSON report at `path`; fails naming the workers
  (with their logs) if it does not come or one of them failed."""
  def ready():
    failed = [p for p in processes if not p.alive() and p.popen.returncode]
    if failed:
      raise AssertionError('a worker failed:\n' + '\n'.join(
          p.describe() for p in failed))
    return os.path.exists(path)
  netns.wait_until(ready, f'the report {os.path.basename(path)}', timeout_s,
                   interval_s=0.1, details=lambda: '\n'.join(
                       p.describe() for p in processes))
  with open(path) as f:
    return json.load(f)


def _signal(directory, name):
  """Tells the workers waiting for `name` to go on."""
  with open(os.path.join(directory, name), 'w') as f:
    f.write('go\n')


# ------------------------------------------------------------------ workers
# Run inside the client namespace (`_start_worker`); each writes its report
# atomically, as JSON, to a file the test waits for.


def _write_report(path, data):
  with open(path + '.tmp', 'w') as f:
    json.dump(data, f, default=str)
  os.replace(path + '.tmp', path)


def _wait_file(path, timeout_s=WORK_S):
  netns.wait_until(lambda: os.path.exists(path),
                   f'the file {path} (the test going on)', timeout_s,
                   interval_s=0.1)


def _items(counters):
  return counters['items']['experience']


def _shard_items(stats):
  return [s['tables']['experience']['items'] for s in stats['shards']]


def auth_client(address, token_file, wrong_token_file, directory):
  """Connects without a token, with a wrong one, with the right one (a
  file given, then `$SMART_REPLAY_CONTROL_TOKEN_FILE`); with it, writes
  and samples."""
  import smart_replay  # pylint: disable=g-import-not-at-top
  from smart_replay import errors  # pylint: disable=g-import-not-at-top
  from tests import testing  # pylint: disable=g-import-not-at-top
  from tests.smart_replay.remote import remote_workers  # pylint: disable=g-import-not-at-top
  _wait_file(os.path.join(directory, 'served'), START_S)

  def attempt(**kwargs):
    manager = smart_replay.ReplayBufferManager(
        data_spec=remote_workers.data_spec(), server_address=address,
        connect_timeout_s=30.0, **kwargs)
    try:
      manager.connect()
    finally:
      manager.close()

  out = {}
  for case, kwargs in (('no_token', {}),
                       ('wrong_token', {'control_token_file':
                                        wrong_token_file})):
    started = time.monotonic()
    try:
      attempt(**kwargs)
      out[case] = {'type': None}
    except errors.AuthenticationError as e:
      out[case] = {'type': type(e).__name__, 'message': str(e),
                   'is_top_level_export': isinstance(
                       e, smart_replay.AuthenticationError)}
    except Exception as e:  # pylint: disable=broad-except
      out[case] = {'type': type(e).__name__, 'message': str(e)}
    out[case]['seconds'] = time.monotonic() - started

  manager, observer = remote_workers.client(address,
                                            control_token_file=token_file)
  record = testing.run_actor(observer, STEPS, seed=3)
  observer.flush()
  out['expected_items'] = len(testing.expected_items(
      record.steps, remote_workers.SEQUENCE_LENGTH))
  out['written'] = observer.counters()
  out['num_frames'] = int(manager.num_frames())
  _, info = next(iter(manager.get_dataset(batch_size=8, num_steps=2)))
  out['sampled_keys'] = sorted({int(k) for k in info.key[:, 0].numpy()})
  out['checkpoint'] = manager.checkpoint(extra={'from': 'client host'})
  manager.close()

  os.environ[TOKEN_FILE_ENV] = token_file  # The other way to pass it.
  by_env, _ = remote_workers.client(address)
  out['env_items'] = by_env.stats()['tables']['experience']['items']
  by_env.close()
  _write_report(os.path.join(directory, 'auth.json'), out)


def actor(addresses, actor_id, directory):
  """A pinned actor (token from `$SMART_REPLAY_CONTROL_TOKEN_FILE`): writes
  STEPS steps, reports; after `go`, STEPS more, reports; after `restored`,
  flushes (its manager sees the restarted shard) and reports what it
  lost."""
  from tests import testing  # pylint: disable=g-import-not-at-top
  from tests.smart_replay.remote import remote_workers  # pylint: disable=g-import-not-at-top
  _wait_file(os.path.join(directory, 'served'), START_S)
  manager, observer = remote_workers.client(addresses, actor_id=actor_id,
                                            reconnect_timeout_s=60.0)
  env = testing.make_env(actor_id)
  policy = testing.make_policy(env, actor_id)
  for phase, wait in enumerate((None, 'go', 'restored')):
    if wait:
      _wait_file(os.path.join(directory, wait))
    if wait != 'restored':
      testing.run_actor(observer, STEPS, env=env, policy=policy)
    manager.flush()  # Its observer's, then what a restart lost is counted.
    _write_report(os.path.join(directory, f'actor{actor_id}-{phase}.json'),
                  {'counters': observer.counters(),
                   'shard': manager.stats()['shards'][actor_id % len(
                       addresses)]['address']})
  manager.close()


def learner(addresses, token_file, directory):
  """After `written`: samples every shard, takes a coordinated checkpoint,
  reports; after `restore`: restores it (`load_replay_buffer()` of a second
  manager), samples again (the first manager's iterator), reports."""
  import smart_replay  # pylint: disable=g-import-not-at-top
  from smart_replay.backends import coordinated_checkpoints  # pylint: disable=g-import-not-at-top
  from tests.smart_replay.remote import remote_workers  # pylint: disable=g-import-not-at-top
  _wait_file(os.path.join(directory, 'served'), START_S)
  manager, _ = remote_workers.client(addresses, actor_id=0,
                                     control_token_file=token_file,
                                     sample_timeout_s=60.0)

  def sample(batches, per_source):
    for _ in range(batches):
      _, info = next(iterator)
      for source in info.shard.numpy()[:, 0].tolist():
        per_source[int(source)] += 1
    return per_source

  _wait_file(os.path.join(directory, 'written'))
  iterator = iter(manager.get_dataset(batch_size=16, num_steps=2))
  before = _shard_items(manager.stats())
  sampled = sample(20, [0] * len(addresses))
  lines = manager.checkpoint(extra={'learner': 'across hosts'})
  _write_report(os.path.join(directory, 'checkpointed.json'),
                {'items': before, 'sampled': sampled, 'checkpoint': lines,
                 'items_at_checkpoint': _shard_items(manager.stats())})

  _wait_file(os.path.join(directory, 'restore'))
  before_restore = _shard_items(manager.stats())
  # A restore is how a manager starts (instead of `connect()`).
  restorer = smart_replay.ReplayBufferManager(
      data_spec=remote_workers.data_spec(), server_address=addresses,
      control_token_file=token_file)
  restorer.load_replay_buffer()
  restored = {'before_restore': before_restore,
              'after_restore': _shard_items(restorer.stats()),
              'loaded_checkpoint': restorer.loaded_checkpoint,
              'record': restorer.loaded_manifest.get(coordinated_checkpoints.EXTRA_KEY)}
  restorer.close()
  # The learner's dataset goes on from the restored shards.
  restored['sampled_after'] = sample(20, [0] * len(addresses))
  restored['items_after_sampling'] = _shard_items(manager.stats())
  _write_report(os.path.join(directory, 'restored.json'), restored)
  manager.close()


def firewalled_client(address, token_file, directory):
  """Once the firewall is up (`firewalled`): connects, writes, checkpoints."""
  from tests import testing  # pylint: disable=g-import-not-at-top
  from tests.smart_replay.remote import remote_workers  # pylint: disable=g-import-not-at-top
  _wait_file(os.path.join(directory, 'firewalled'), START_S)
  manager, observer = remote_workers.client(address,
                                            control_token_file=token_file)
  record = testing.run_actor(observer, STEPS, seed=5)
  observer.flush()
  out = {'expected_items': len(testing.expected_items(
      record.steps, remote_workers.SEQUENCE_LENGTH)),
         'items': manager.stats()['tables']['experience']['items'],
         'checkpoint': manager.checkpoint()}
  manager.close()
  _write_report(os.path.join(directory, 'firewalled.json'), out)


_ROLES = {'auth_client': auth_client, 'actor': actor, 'learner': learner,
          'firewalled_client': firewalled_client}


# -------------------------------------------------------------------- tests


def test_the_default_addresses_are_not_reachable_from_another_host(
    hosts, tmp_path):
  server, = _serving(_serve(hosts.server, tmp_path, 'buffer', PORT))
  control = PORT + 1
  # What the server host's kernel says: control and Reverb on loopback only.
  listening = hosts.server.listening()
  for port in (PORT, control):
    assert [a for a, p in listening if p == port] == ['127.0.0.1'], (
        port, listening)
    from_client = hosts.client.connect(SERVER, port)
    assert from_client == {'connected': False, 'error': 'ECONNREFUSED'}, (
        port, from_client, server.describe())
    on_server = hosts.server.connect('127.0.0.1', port)
    assert on_server['connected'], (port, on_server, server.describe())
  # Refused, not timed out: the server host answers on the link, and
  # nothing listens there.
  assert server.alive(), server.describe()


def test_a_token_guards_the_control_service_across_hosts(hosts, tmp_path):
  token_file = _token_file(tmp_path / 'control.token')
  wrong = _token_file(tmp_path / 'wrong.token')
  server = _serve(hosts.server, tmp_path, 'buffer', PORT,
                  f'--reverb_host={SERVER}', f'--control_host={SERVER}',
                  f'--control_token_file={token_file}')
  client = _start_worker(hosts.client, 'auth_client', 'auth-client',
                         address=f'{SERVER}:{PORT}', token_file=token_file,
                         wrong_token_file=wrong, directory=str(tmp_path))
  _serving(server)  # The client imports TensorFlow meanwhile.
  _signal(str(tmp_path), 'served')
  listening = hosts.server.listening()
  # Both on the link's address only: not on the server's loopback.
  for port in (PORT, PORT + 1):
    assert [a for a, p in listening if p == port] == [SERVER], listening
  assert hosts.server.connect('127.0.0.1', PORT) == {
      'connected': False, 'error': 'ECONNREFUSED'}
  got = _report(str(tmp_path / 'auth.json'), [server, client], WORK_S)
  for case in ('no_token', 'wrong_token'):
    refused = got[case]
    assert refused['type'] == 'AuthenticationError', (case, refused,
                                                      client.describe())
    assert refused['is_top_level_export']
    assert refused['seconds'] < 10, refused  # Refused, not timed out.
    assert f'{SERVER}:{PORT + 1}' in refused['message'], refused
  # It says where it looked for a token.
  assert TOKEN_ENV in got['no_token']['message'], got['no_token']
  assert TOKEN_FILE_ENV in got['no_token']['message'], got['no_token']
  assert f'control_token_file={wrong}' in got['wrong_token']['message'], (
      got['wrong_token'])

  assert _items(got['written']) == got['expected_items'] > 0, got
  assert got['num_frames'] == got['expected_items']
  assert got['sampled_keys'], got
  assert got['checkpoint'].startswith(str(tmp_path / 'buffer')), got
  assert got['env_items'] == got['expected_items']
  assert client.wait(60) == 0, client.describe()
  server.wait_for('refused without a valid token', 30)  # It logs refusals.
  assert server.alive(), server.describe()


def _record_items(record):
  return [shard['counts']['tables']['experience']['items']
          for shard in record['shards']]


def test_three_shards_actors_and_a_learner_across_hosts(hosts, tmp_path):
  token_file = _token_file(tmp_path / 'control.token')
  directory = str(tmp_path / 'reports')
  os.makedirs(directory)
  # Reverb on the link's address, the first shard's on every interface.
  reverb_hosts = ['0.0.0.0'] + [SERVER] * (len(SHARD_PORTS) - 1)
  servers = [_serve(hosts.server, tmp_path, f'shard{k}', port,
                    f'--reverb_host={reverb_host}',
                    f'--control_host={SERVER}',
                    f'--control_token_file={token_file}')
             for k, (port, reverb_host) in enumerate(zip(SHARD_PORTS,
                                                         reverb_hosts))]
  addresses = [f'{SERVER}:{port}' for port in SHARD_PORTS]
  # The actors take the token from the environment, the learner as a file.
  actors = [_start_worker(hosts.client, 'actor', f'actor{k}',
                          env=_client_env(**{TOKEN_FILE_ENV: token_file}),
                          addresses=addresses, actor_id=k,
                          directory=directory) for k in range(ACTORS)]
  learner_process = _start_worker(hosts.client, 'learner', 'learner',
                                  addresses=addresses, token_file=token_file,
                                  directory=directory)
  workers = servers + actors + [learner_process]
  _serving(*servers)  # The clients import TensorFlow meanwhile.
  listening = hosts.server.listening()
  assert [[a for a, p in listening if p == port] for port in SHARD_PORTS] \
      == [['::'], [SERVER], [SERVER]], listening
  _signal(directory, 'served')

  def reports(phase):
    return [_report(os.path.join(directory, f'actor{k}-{phase}.json'),
                    workers, START_S + WORK_S) for k in range(ACTORS)]

  first = reports(0)
  assert [r['shard'] for r in first] == addresses  # Actor k on shard k.
  _signal(directory, 'written')
  saved = _report(os.path.join(directory, 'checkpointed.json'), workers)
  assert saved['items'] == [_items(r['counters']) for r in first], saved
  assert all(n > 0 for n in saved['sampled']), saved  # Every shard sampled.
  coordinated_line, *shard_lines = saved['checkpoint'].splitlines()
  assert coordinated_line.startswith('coordinated ')
  assert [line.split()[0] for line in shard_lines] == addresses
  coordinated_id = coordinated_line.split()[1]
  records = []
  for k in range(len(SHARD_PORTS)):  # Every shard holds the same record.
    with open(tmp_path / f'shard{k}' / 'coordinated' /
              f'{coordinated_id}.json') as f:
      records.append(json.load(f))
  # The same record on every shard (each adds its own `shard` and time).
  common = lambda r: {k: r[k] for k in ('id', 'extra', 'shards')}
  assert all(common(r) == common(records[0]) for r in records), records
  in_record = _record_items(records[0])
  assert in_record == saved['items_at_checkpoint'] == saved['items']

  _signal(directory, 'go')  # More after the checkpoint: the restore drops it.
  second = reports(1)
  more = [_items(r['counters']) - _items(f['counters'])
          for r, f in zip(second, first)]
  assert all(n > 0 for n in more), more
  _signal(directory, 'restore')
  restored = _report(os.path.join(directory, 'restored.json'), workers)
  assert restored['before_restore'] == [
      a + b for a, b in zip(in_record, more)], restored
  assert restored['loaded_checkpoint'] == coordinated_line
  assert common(restored['record']) == common(records[0]), restored
  assert restored['after_restore'] == in_record, restored
  assert all(n > 0 for n in restored['sampled_after']), restored
  assert restored['items_after_sampling'] == in_record

  _signal(directory, 'restored')
  for k, last in enumerate(reports(2)):  # Each actor counts its loss.
    assert last['counters']['lost_items'] == more[k], (k, last)
  for process in actors + [learner_process]:
    assert process.wait(60) == 0, process.describe()
  assert all(s.alive() for s in servers), '\n'.join(
      s.describe() for s in servers)


def _firewall(ports):
  """An nftables rule set for the server's namespace that admits only the
  allowed client to Reverb's and the control port: the shape of
  docs/remote.md's Security rule, adapted. Loopback stays open (the server
  reaches its own Reverb port at localhost: checkpoints and the status line
  need it), and everything else is dropped, IPv6 too (Reverb listens on
  '::'; an `ip saddr` rule alone matches IPv4 only)."""
  ports = ', '.join(str(p) for p in ports)
  return (
      'table inet smart_replay {\n'
      '  chain input {\n'
      '    type filter hook input priority 0; policy accept;\n'
      f'    iifname != "lo" tcp dport {{ {ports} }} ip saddr != {CLIENT} '
      'drop\n'
      f'    iifname != "lo" tcp dport {{ {ports} }} meta nfproto ipv6 drop\n'
      '  }\n'
      '}\n')


def test_a_firewall_admits_only_the_allowed_client_to_reverb(hosts, tmp_path):
  nft = netns.nft_or_skip()
  server6, other6 = netns.SERVER_ADDRESS6, netns.OTHER_CLIENT_ADDRESS6
  hosts.server.add_address(f'{server6}/{netns.PREFIX_LENGTH6}')
  hosts.client.add_address(f'{other6}/{netns.PREFIX_LENGTH6}')
  token_file = _token_file(tmp_path / 'control.token')
  server = _serve(hosts.server, tmp_path, 'buffer', PORT,
                  '--reverb_host=0.0.0.0', f'--control_host={SERVER}',
                  f'--control_token_file={token_file}')
  client = _start_worker(hosts.client, 'firewalled_client', 'client',
                         address=f'{SERVER}:{PORT}', token_file=token_file,
                         directory=str(tmp_path))
  _serving(server)  # The client imports TensorFlow meanwhile.
  ports = (PORT, PORT + 1)
  # Without a firewall every address on the link reaches Reverb ('::').
  listening = hosts.server.listening()
  assert [a for a, p in listening if p == PORT] == ['::'], listening
  for source in (CLIENT, OTHER):
    for port in ports:
      got = hosts.client.connect(SERVER, port, source=source)
      assert got == {'connected': True, 'local': source}, (source, port, got)
  assert hosts.client.connect(server6, PORT, source=other6)['connected']

  rules = tmp_path / 'firewall.nft'
  rules.write_text(_firewall(ports))
  hosts.server.run([nft, '-f', str(rules)], what='loading the rule set')
  listed = hosts.server.run([nft, 'list', 'ruleset'],
                            what='listing the rule set').stdout
  assert f'ip saddr != {CLIENT} drop' in listed, listed

  for port in ports:
    blocked = hosts.client.connect(SERVER, port, source=OTHER, timeout_s=1.5)
    assert blocked == {'connected': False, 'error': 'timeout'}, (
        port, blocked, listed)
    allowed = hosts.client.connect(SERVER, port, source=CLIENT)
    assert allowed == {'connected': True, 'local': CLIENT}, (port, allowed,
                                                             listed)
  blocked6 = hosts.client.connect(server6, PORT, source=other6,
                                  timeout_s=1.5)
  assert blocked6 == {'connected': False, 'error': 'timeout'}, (blocked6,
                                                                listed)
  # The server's own loopback stays open ...
  assert hosts.server.connect('127.0.0.1', PORT)['connected']
  # ... and the allowed client works through the firewall: it writes, and
  # the server checkpoints (through its own loopback client).
  _signal(str(tmp_path), 'firewalled')
  got = _report(str(tmp_path / 'firewalled.json'), [server, client])
  assert got['items'] == got['expected_items'] > 0, got
  assert got['checkpoint'].startswith(str(tmp_path / 'buffer')), got
  assert client.wait(60) == 0, client.describe()
  assert server.alive(), server.describe()


def _main(argv):
  role, args = argv[1], json.loads(argv[2])
  _ROLES[role](**args)


if __name__ == '__main__':
  _main(sys.argv)
