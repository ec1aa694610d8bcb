"""`smart-replay-inspect` and Prometheus over a buffer sharded across three
in-process servers: the tables summed, every shard, a shard down."""

import urllib.request

from prometheus_client import parser
import pytest

from smart_replay.remote import metrics
from smart_replay.tools import sharded_inspection
from tests import testing
from tests.smart_replay.remote import in_process_shards

shards = in_process_shards.shards
_client = in_process_shards.client


def _scrape(url):
  with urllib.request.urlopen(url, timeout=30) as response:
    text = response.read().decode()
  return {(s.name, tuple(sorted(s.labels.items()))): s.value
          for family in parser.text_string_to_metric_families(text)
          for s in family.samples}


def test_inspect_and_prometheus_show_the_sum_and_every_shard(shards,
                                                             data_spec):
  addresses = shards(3)
  written = []
  for actor_id in range(3):
    manager, observer = _client(addresses, data_spec, actor_id=actor_id)
    testing.run_actor(observer, 20 * (actor_id + 1), seed=actor_id)
    manager.flush()
    written.append(observer.num_items)
    manager.close()
  learner, _ = _client(addresses, data_spec, actor_id=0)
  coordinated_id = learner.checkpoint().splitlines()[0].split(' ')[1]

  described = sharded_inspection.describe(','.join(addresses))
  assert described['tables']['experience']['items'] == sum(written)
  assert [s['tables']['experience']['items']
          for s in described['shards']] == written
  assert described['coordinated'] == [coordinated_id]
  text = sharded_inspection.format_text(described)
  assert 'Shards (3; tables above are summed over those up):' in text
  assert f'Coordinated checkpoints on every shard up: 1, newest ' \
         f'{coordinated_id}' in text
  with pytest.raises(ValueError, match="'h1' in 'h1,h2:8000' is not one"):
    sharded_inspection.describe('h1,h2:8000')

  with metrics.MetricsEndpoint(learner, port=0) as endpoint:
    scraped = _scrape(endpoint.url)
    assert scraped[('smart_replay_up', ())] == 1
    assert scraped[('smart_replay_table_items',
                    (('table', 'experience'),))] == sum(written)
    for k, address in enumerate(addresses):
      labels = (('address', address), ('shard', str(k)))
      assert scraped[('smart_replay_shard_up', labels)] == 1
      assert scraped[('smart_replay_shard_table_items',
                      labels[:1] + labels[1:] + (('table', 'experience'),)
                      )] == written[k]
    shards.servers[2].close(final_checkpoint=False)
    scraped = _scrape(endpoint.url)
    assert scraped[('smart_replay_shard_up', (
        ('address', addresses[2]), ('shard', '2')))] == 0
    assert scraped[('smart_replay_table_items',
                    (('table', 'experience'),))] == sum(written[:2])
  text = sharded_inspection.format_text(
      sharded_inspection.describe(','.join(addresses), timeout_s=2.0))
  assert f'2 {addresses[2]}: DOWN' in text
  learner.close()
