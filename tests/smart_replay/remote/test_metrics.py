"""The Prometheus endpoint of a served buffer, scraped as Prometheus would."""

import socket
import urllib.request

from prometheus_client import parser
import pytest

import smart_replay
from smart_replay.remote import metrics
from smart_replay.remote import replay_server
from tests import testing


def _scrape(url):
  with urllib.request.urlopen(url, timeout=30) as response:
    text = response.read().decode()
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
  endpoint.close()
  endpoint.close()
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
