"""Tests for smart_replay.server."""

import time

import portpicker
import pytest
import reverb
import tensorflow as tf

from smart_replay import errors
from smart_replay import server


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
      [_table()], checkpoint_root=str(tmp_path / 'root'))
  try:
    assert server.server_info(client, 2.0)['q'].current_size == 0
    with pytest.raises(ValueError, match=f'port {local.port} is already in use'):
      server.start_local_server([_table()],
                                checkpoint_root=str(tmp_path / 'other'),
                                port=local.port)
  finally:
    local.stop()
