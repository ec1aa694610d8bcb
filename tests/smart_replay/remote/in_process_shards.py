"""Shards of a sharded buffer in the test's process: `ReplayServer`s, each
on its own port and directory (the server of `smart-replay-serve`), all
with one control token file and one server identity (key and
certificate), which the test's clients find through
`$SMART_REPLAY_CONTROL_TOKEN_FILE` (the token file carries the
certificate)."""

import os

import pytest

import smart_replay
from smart_replay.remote import replay_server as serve
from smart_replay.control import access as control_access
from smart_replay.control import credentials
from tests.smart_replay.remote import remote_workers


def shared_credentials(folder):
  """`(token_file, identity_file)` shared by a test's servers (made once):
  serve with `ControlAccess(token_file=token_file, tls_cert_file=
  identity_file, tls_key_file=identity_file)`; clients use `token_file`."""
  token_file = os.path.join(folder, 'shared.token')
  if os.path.exists(token_file):
    return token_file, os.path.join(folder, 'shared.pem')
  return smart_replay.new_shared_control_credentials(folder)


def shared_access(folder, **kwargs):
  """The `ControlAccess` of a test's servers (`shared_credentials`)."""
  token_file, identity_file = shared_credentials(folder)
  return control_access.ControlAccess(
      token_file=token_file, tls_cert_file=identity_file,
      tls_key_file=identity_file, **kwargs)


@pytest.fixture
def shards(tmp_path, data_spec, monkeypatch):
  """`start(n, **manager_kwargs)`: n servers; returns their addresses.
  `start.servers` lists them; `start.restart(k)` serves shard k again on
  its port, from its directory, with the same arguments; `start.token_file` is their token
  file."""
  servers, made, ports, arguments = [], [], [], []
  token_file, _ = shared_credentials(str(tmp_path))
  monkeypatch.setenv(credentials.TOKEN_FILE_ENV, token_file)

  def serve_shard(index, port, kwargs):
    manager = smart_replay.ReplayBufferManager(
        data_spec=data_spec, capacity=1000,
        checkpoint_dir=str(tmp_path / f'shard{index}'), port=port,
        **{'sequence_length': 2, **kwargs})
    server = serve.ReplayServer(
        manager, control_port=port + 1,
        access=shared_access(str(tmp_path)))
    server.start()
    made.append(server)
    return server

  def start(n=3, **kwargs):
    for index in range(len(servers), len(servers) + n):
      ports.append(remote_workers.free_port_pair())
      arguments.append(kwargs)
      servers.append(serve_shard(index, ports[index], kwargs))
    return [s.manager.server_address for s in servers[-n:]]

  def restart(index):
    servers[index] = serve_shard(index, ports[index], arguments[index])

  start.servers, start.restart = servers, restart
  start.token_file = token_file
  yield start
  for server in made:
    server.close(final_checkpoint=False)


def client(addresses, data_spec, **kwargs):
  """A connected client of the shards; returns `(manager, observer)`."""
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec, server_address=addresses, sample_timeout_s=10.0,
      write_timeout_s=10.0, **kwargs)
  _, observer = manager.connect()
  return manager, observer
