"""Tests for smart_replay.server.local_server."""

import socket
import time

import portpicker
import pytest
import reverb
import tensorflow as tf

from smart_replay import errors
from smart_replay.server import local_server as server


def _table():
  return reverb.Table.queue('q', 10, signature={'x': tf.TensorSpec([1],
                                                                  tf.float32)})


def test_dead_server_fails_within_timeout():
  client = reverb.Client(f'localhost:{portpicker.pick_unused_port()}')
  start = time.monotonic()
  with pytest.raises(errors.WaitTimeoutError, match='did not answer'):
    server.server_info(client, 1.0)
  assert time.monotonic() - start < 5


def test_start_local_server_answers_and_refuses_busy_port(tmp_path):
  local, client = server.start_local_server(
      lambda: [_table()], checkpoint_root=str(tmp_path / 'root'))
  try:
    assert server.server_info(client, 2.0)['q'].current_size == 0
    with pytest.raises(ValueError, match=f'port {local.port} is already in use'):
      server.start_local_server(lambda: [_table()],
                                checkpoint_root=str(tmp_path / 'other'),
                                port=local.port)
  finally:
    local.stop()


def test_a_port_taken_before_the_server_binds_it_is_retried(tmp_path,
                                                            monkeypatch):
  """The race between picking a free port and binding it loses a try only."""
  blocker = socket.socket()
  blocker.bind(('localhost', 0))
  blocker.listen()
  taken = blocker.getsockname()[1]
  picks = iter([taken, taken])
  real_free_port = server._free_port  # pylint: disable=protected-access
  monkeypatch.setattr(server, '_free_port',
                      lambda: next(picks, None) or real_free_port())
  try:
    local, client = server.start_local_server(
        lambda: [_table()], checkpoint_root=str(tmp_path / 'root'))
    try:
      assert local.port != taken
      assert server.server_info(client, 2.0)['q'].current_size == 0
    finally:
      local.stop()
    picks = iter([taken] * server.START_ATTEMPTS)
    monkeypatch.setattr(server, '_free_port', lambda: next(picks))
    with pytest.raises(ValueError, match='BuildAndStart'):
      server.start_local_server(lambda: [_table()],
                                checkpoint_root=str(tmp_path / 'other'))
  finally:
    blocker.close()
