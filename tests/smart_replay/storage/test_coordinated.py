"""Records of coordinated checkpoints on a shard's disk."""

import json
import os

import pytest

from smart_replay.storage import coordinated_records


def _record(coordinated_id, paths=('/a/ckpt-000001',), shard=0):
  return {'id': coordinated_id, 'created_utc': 'now', 'shard': shard,
          'shards': [{'address': f'h{k}:8000', 'path': path, 'counts': {}}
                     for k, path in enumerate(paths)]}


ID1 = '20261126T061500000001Z-0a1b2c3d'
ID2 = '20261126T061600000001Z-ffffffff'
ID3 = '20261126T061700000001Z-00000000'


def test_records_are_written_whole_read_in_order_and_bounded(tmp_path):
  for coordinated_id in (ID2, ID1, ID3):
    path = coordinated_records.write_record(str(tmp_path), _record(coordinated_id),
                                    keep=2)
    assert json.load(open(path))['id'] == coordinated_id
  # Pruned by the server's write time, never by the id a client chose.
  assert [r['id'] for r in coordinated_records.read_records(str(tmp_path))] == [
      ID1, ID3]
  assert sorted(os.listdir(tmp_path / coordinated_records.RECORDS_DIR)) == [
      f'{ID1}.json', f'{ID3}.json']


def test_far_future_ids_cannot_push_real_records_out(tmp_path):
  with pytest.raises(ValueError, match=r"id must be no later than this "
                     r"server's clock \(20\d\d-.*plus 300 s"):
    coordinated_records.write_record(str(tmp_path),
                             _record('99991231T235959999999Z-deadbeef'))
  # Planted on disk anyway (by hand): skipped when read, and pruned first.
  folder = tmp_path / coordinated_records.RECORDS_DIR
  folder.mkdir()
  planted = dict(_record('99991231T235959999999Z-deadbeef'),
                 recorded_unix=0.0)
  (folder / f'{planted["id"]}.json').write_text(json.dumps(planted))
  coordinated_records.write_record(str(tmp_path), _record(ID1), keep=1)
  assert os.listdir(folder) == [f'{ID1}.json']
  assert [r['id'] for r in coordinated_records.read_records(str(tmp_path))] == [ID1]


def test_an_unreadable_record_is_skipped(tmp_path):
  coordinated_records.write_record(str(tmp_path), _record(ID1))
  (tmp_path / coordinated_records.RECORDS_DIR / f'{ID2}.json').write_text('{"id": ')
  assert [r['id'] for r in coordinated_records.read_records(str(tmp_path))] == [ID1]
  assert coordinated_records.read_records(str(tmp_path / 'none')) == []


@pytest.mark.parametrize('record, message', [
    (_record('ckpt-1'), "looks like '20261126T061500123456Z-0a1b2c3d', got "
     "'ckpt-1'"),
    (_record(ID1 + '\n'), 'looks like'),  # `$` would let a newline through.
    (_record('20261399T000000Z-0a1b2c3d'), 'does not start with a real UTC'),
    ({'id': ID1, 'shards': [], 'shard': 0}, 'shards must be a list of 1 to'),
    (_record(ID1, shard=7), 'shard must be an index of shards, 0 to 0, got 7'),
    (_record(ID1, shard='0'), "shard must be an index of shards"),
    (dict(_record(ID1), shards='x'), "shards must be a list"),
    (dict(_record(ID1), shards=[{'path': 1}]),
     r'shards\[0\].address must be a string'),
    (dict(_record(ID1), extra='x'), 'extra must be a JSON object'),
    (dict(_record(ID1), extra={'a': 'x' * (300 << 10)}),
     'its size in bytes must be at most 262144'),
    (['not', 'a', 'dict'], 'the record must be a JSON object'),
])
def test_bad_records_are_refused(tmp_path, record, message):
  with pytest.raises(ValueError, match=message):
    coordinated_records.write_record(str(tmp_path), record)
  assert coordinated_records.read_records(str(tmp_path)) == []


def test_a_poisoned_record_on_disk_is_skipped_not_fatal(tmp_path):
  coordinated_records.write_record(str(tmp_path), _record(ID1))
  folder = tmp_path / coordinated_records.RECORDS_DIR
  (folder / f'{ID2}.json').write_text(json.dumps(_record(ID2, shard=7)))
  (folder / f'{ID3}.json').write_text(json.dumps(_record(ID1)))  # Misnamed.
  assert [r['id'] for r in coordinated_records.read_records(str(tmp_path))] == [ID1]


def test_the_newest_record_every_shard_holds_and_can_load_wins():
  first, second, third = _record(ID1), _record(ID2), _record(ID3)
  # ID3 is only on shard 0 (a save killed while recording it).
  held = [[first, second, third], [first, second], [second, first]]
  assert coordinated_records.newest_common(held)['id'] == ID2
  # Shard 1 no longer holds its checkpoint of ID2: ID1 is the newest usable.
  assert coordinated_records.newest_common(
      held, [[ID1, ID2, ID3], [ID1], [ID1, ID2]])['id'] == ID1
  assert coordinated_records.newest_common([[third], [first]]) is None
  assert coordinated_records.newest_common([]) is None


def test_retention_group_reads_the_manifest_extra():
  group = coordinated_records.retention_group
  assert group({'extra': {coordinated_records.EXTRA_KEY: ID1}}) == 'coordinated'
  assert group({'extra': {coordinated_records.REQUESTED_KEY: True}}) == 'requested'
  assert group({'extra': {}}) == group({}) == 'own'
  assert group({'extra': {coordinated_records.EXTRA_KEY: ID1}}, {ID2}) == (
      coordinated_records.UNCOMMITTED_GROUP)
  assert group({'extra': {coordinated_records.EXTRA_KEY: ID1}}, {ID1}) == (
      'coordinated')


def test_the_newest_record_is_chosen_by_the_servers_clock():
  """The review's C3: an id a token holder set ahead (within the allowed
  skew) does not win over a record the server stored later."""
  ahead = dict(_record('20261126T062100000001Z-aaaaaaaa'), recorded_unix=100.0)
  later = dict(_record(ID1), recorded_unix=200.0)
  assert coordinated_records.newest_common([[ahead, later]])['id'] == ID1


def test_a_record_is_checked_with_its_stamp(tmp_path):
  """The review's C4: a record that fits only without the server's stamp is
  refused when committed, not stored and then skipped by every read."""
  record = _record(ID1)
  room = coordinated_records.MAX_RECORD_BYTES - len(json.dumps(record))
  record['extra'] = {'pad': 'x' * (room - len(', "extra": {"pad": ""}') - 2)}
  assert len(json.dumps(record)) <= coordinated_records.MAX_RECORD_BYTES
  with pytest.raises(ValueError, match='its size in bytes'):
    coordinated_records.write_record(str(tmp_path), record)
  assert coordinated_records.read_records(str(tmp_path)) == []
