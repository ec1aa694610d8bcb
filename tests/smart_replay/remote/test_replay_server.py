"""ReplayServer in-process: schedules, control service, resume and refusal.

A client-mode manager in the same process talks to it over loopback gRPC
(Reverb and the control service), as a remote actor or learner would.
"""

import os
import socket
import time

import pytest

import smart_replay
from smart_replay.remote import opening
from smart_replay.remote import replay_server as serve
from smart_replay.server import local_server
from smart_replay.spec import specs
from smart_replay.utils import ports
from smart_replay.control import credentials as credentials_lib
from tests import testing


@pytest.fixture
def server_for(tmp_path, data_spec):
  servers = []

  def start(checkpoint_dir=None, **kwargs):
    manager = smart_replay.ReplayBufferManager(
        data_spec=data_spec, capacity=1000, sequence_length=2,
        checkpoint_dir=str(checkpoint_dir or tmp_path / 'buffer'))
    server = serve.ReplayServer(manager, control_port=None, **kwargs)
    server.start()
    servers.append(server)
    return server

  yield start
  for server in servers:
    server.close(final_checkpoint=False)


def _client(server, data_spec, **kwargs):
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=server.manager.server_address,
      control_address=f'localhost:{server.control_port}',
      control_token_file=server.token_file,
      sample_timeout_s=5.0, write_timeout_s=5.0, **kwargs)
  return (manager,) + manager.connect()


def test_arguments_are_checked(make_manager):
  manager = make_manager()
  for kwargs, match in (({'checkpoint_every_s': 0}, 'checkpoint_every_s'),
                        ({'checkpoint_every_inserts': 2.5},
                         'checkpoint_every_inserts'),
                        ({'log_every_s': -1}, 'log_every_s'),
                        ({'on_existing': 'merge'}, 'on_existing'),
                        ({'control_port': 70000}, 'control_port')):
    with pytest.raises(ValueError, match=match):
      serve.ReplayServer(manager, **kwargs)


def test_client_mode_offers_the_same_api(server_for, data_spec):
  server = server_for(checkpoint_every_inserts=10_000)
  client, replay_buffer, observer = _client(server, data_spec)
  try:
    record = testing.run_actor(observer, 60, seed=3)
    observer.flush()
    want = testing.expected_items(record.steps, 2)
    assert client.num_frames() == replay_buffer.num_frames() == len(want)
    seen = testing.sample_all_items(client)
    assert sorted(seen.values()) == sorted(map(testing.item_fingerprint,
                                               want))
    stats = client.stats(times_sampled=True)
    assert stats['env_steps'] == record.env_steps
    assert set(stats['tables']['experience']['times_sampled']) == set(seen)
    path = client.checkpoint(extra={'train_step': 7})
    assert client.existing_checkpoints() == [path]
    assert client.checkpoint_dir == server.manager.checkpoint_dir
    assert smart_replay.ReplayBufferManager.from_checkpoint(
        path, checkpoint_dir=os.path.dirname(path) + '-copy'
    ).sequence_length == 2
    with pytest.raises(smart_replay.ManagerStateError, match='connect'):
      client.create_replay_buffer()
  finally:
    client.close()
  assert server.manager.num_frames() == len(want)  # The server goes on.


def test_client_mode_arguments():
  with pytest.raises(ValueError, match="'host:port'"):
    smart_replay.ReplayBufferManager(data_spec=_spec(), server_address='nope')
  with pytest.raises(ValueError, match='checkpoint_dir'):
    smart_replay.ReplayBufferManager(data_spec=_spec(), server_address='h:1',
                                     checkpoint_dir='/tmp/x')
  with pytest.raises(ValueError, match='capacity'):
    smart_replay.ReplayBufferManager(data_spec=_spec(), checkpoint_dir='/x')


def _spec():
  return testing.collect_data_spec(testing.make_env())


def test_scheduled_checkpoints_by_inserts_and_time(server_for, data_spec):
  server = server_for(checkpoint_every_inserts=50, checkpoint_every_s=3600)
  client, _, observer = _client(server, data_spec)
  try:
    assert server.poll() is None  # Nothing inserted yet.
    testing.run_actor(observer, 30, seed=1)
    observer.flush()
    assert server.poll() is None  # Fewer than 50 inserts.
    testing.run_actor(observer, 40, seed=2)
    observer.flush()
    first = server.poll()
    assert first and server.last_checkpoint == first
    assert server.poll() is None  # Nothing new.
  finally:
    client.close()
  timed = server_for(checkpoint_dir=server.manager.checkpoint_dir + '2',
                     checkpoint_every_s=0.2)
  time.sleep(0.3)
  assert timed.poll() is None  # Due, but nothing changed: skipped.


def test_close_writes_a_final_checkpoint_and_restart_resumes(
    server_for, data_spec, tmp_path):
  server = server_for()
  client, _, observer = _client(server, data_spec)
  testing.run_actor(observer, 40, seed=4)
  client.close()
  items = server.manager.num_frames()
  final = server.close()
  assert final and os.path.isdir(final)

  resumed = server_for()
  assert resumed.last_checkpoint == final
  assert resumed.manager.num_frames() == items
  assert resumed.close() == final  # Unchanged: no new checkpoint.

  with pytest.raises(smart_replay.CheckpointExistsError, match='resume'):
    server_for(on_existing='refuse')
  empty = server_for(on_existing='overwrite')
  assert empty.manager.num_frames() == 0


def test_status_line_names_sizes_rates_and_checkpoint(server_for, data_spec):
  server = server_for()
  client, _, observer = _client(server, data_spec)
  try:
    testing.run_actor(observer, 30, seed=5)
    observer.flush()
  finally:
    client.close()
  line = server.status_line(server.manager.stats(), time.monotonic())
  assert f'serving {server.address}' in line
  assert 'experience: 29/1,000 items' in line
  assert 'inserts/s' in line and 'samples/s' in line
  assert 'no checkpoint yet' in line


def test_spec_file_round_trip(tmp_path, data_spec):
  path = str(tmp_path / 'sub' / 'spec.pbtxt')
  specs.save_spec(path, data_spec)
  loaded = specs.load_spec(path)
  assert specs.diff_specs(data_spec, loaded, bounds_for=['action']) == []
  assert type(loaded).__name__ == 'Trajectory'
  with pytest.raises(FileNotFoundError, match='save_spec'):
    specs.load_spec(str(tmp_path / 'missing.pbtxt'))
  bad = tmp_path / 'bad.pbtxt'
  bad.write_text('not a spec {')
  with pytest.raises(ValueError, match='not a TF-Agents spec file'):
    specs.load_spec(str(bad))


def test_control_service_refuses_a_port_in_use_and_reraises_errors(
    tmp_path):
  # pylint: disable-next=g-import-not-at-top
  from smart_replay.control import client as control_client
  # pylint: disable-next=g-import-not-at-top
  from smart_replay.control import server as control_server
  # pylint: disable-next=g-import-not-at-top
  from smart_replay.control import access as control_access
  def fails(request):
    raise smart_replay.WaitTimeoutError(f'took too long: {request}')
  access = control_access.ControlAccess()
  secrets = access.secrets(str(tmp_path / 'buffer'))
  first = control_server.ControlServer(
      {'info': lambda request: {'ok': 1}, 'checkpoint': fails}, port=0,
      access=access, secrets=secrets)
  try:
    with pytest.raises(ValueError, match=f'127.0.0.1:{first.port}'):
      control_server.ControlServer({'info': dict}, port=first.port,
                                   access=access, secrets=secrets)
    client = control_client.ControlClient(
        f'localhost:{first.port}',
        credentials=credentials_lib.ClientCredentials.resolve(
            token_file=secrets.operator_file, environ={}))
    assert client.call('info', timeout_s=5) == {'ok': 1}
    with pytest.raises(smart_replay.WaitTimeoutError,
                       match=r"from the server .* took too long: \{'x': 1\}"):
      client.call('checkpoint', {'x': 1}, timeout_s=5)
    with pytest.raises(ValueError, match="method must be one of .* 'missing'"):
      client.call('missing', timeout_s=5)
    client.close()
  finally:
    first.stop()


def test_a_restore_that_fails_after_its_checks_stops_serving_cleanly(
    server_for, data_spec, monkeypatch):
  """The disk fails between the checks and the load: nothing can be reopened,
  so the server stops serving (poll and serve_until raise) instead of keeping
  a closed buffer behind a running process; the checkpoints stay."""
  server = server_for()
  client, _, observer = _client(server, data_spec)
  testing.run_actor(observer, 20, seed=6)
  client.close()
  first = server.checkpoint(reason='test')
  on_disk = sorted(os.listdir(os.path.dirname(first)))

  def disk_failed(self, *args, **kwargs):
    raise smart_replay.CheckpointCorruptError('the disk failed (injected)')
  monkeypatch.setattr(smart_replay.ReplayBufferManager, 'load_replay_buffer',
                      disk_failed)
  with pytest.raises(opening.ReopenFailed, match='is not served any more'):
    server.reload(first, reason='test')
  with pytest.raises(opening.ReopenFailed):
    server.poll()
  with pytest.raises(opening.ReopenFailed):
    server.serve_until(lambda: False)
  assert server.close() == first
  assert sorted(os.listdir(os.path.dirname(first))) == on_disk


def test_a_taken_control_port_is_refused_before_the_buffer_opens(tmp_path,
                                                                 data_spec):
  port = ports.free_port_pair()
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec, capacity=100, checkpoint_dir=str(tmp_path / 'b'),
      port=port)
  with socket.socket() as squatter:  # Any process's socket on port + 1.
    squatter.bind(('127.0.0.1', port + 1))
    with pytest.raises(ValueError, match=(
        f"control port, Reverb's port {port} \\+ 1, {port + 1} is in use.*"
        'control_port .smart-replay-serve: --control_port')):
      serve.ReplayServer(manager).start()
    assert manager.server_address is None  # Nothing was opened.
    other = ports.free_port_pair()
    with serve.ReplayServer(manager, control_port=other) as server:
      assert server.control_port == other


def test_automatic_ports_move_the_control_service_off_a_taken_port(
    tmp_path, data_spec, monkeypatch):
  port = ports.free_port_pair()
  # Reverb gets `port`, whose + 1 a process takes before the control
  # service binds it.
  monkeypatch.setattr(local_server, '_free_port', lambda: port)
  with socket.socket() as squatter:
    squatter.bind(('127.0.0.1', port + 1))
    manager = smart_replay.ReplayBufferManager(
        data_spec=data_spec, capacity=100, sequence_length=2,
        checkpoint_dir=str(tmp_path / 'b'))
    with serve.ReplayServer(manager) as server:
      assert server.port == port and server.control_port != port + 1
      client, _, observer = _client(server, data_spec)
      try:
        testing.run_actor(observer, 10, seed=1)
        observer.flush()
        assert client.checkpoint()  # A control call, on the new port.
      finally:
        client.close()
