"""Records of coordinated checkpoints on a shard's disk."""

import json
import os

import pytest

from smart_replay.storage import coordinated


def _record(coordinated_id, paths=('/a/ckpt-000001',)):
  return {'id': coordinated_id, 'created_utc': 'now',
          'shards': [{'address': f'h{k}:8000', 'path': path, 'counts': {}}
                     for k, path in enumerate(paths)]}


ID1 = '20261126T061500000001Z-0a1b2c3d'
ID2 = '20261126T061600000001Z-ffffffff'
ID3 = '20261126T061700000001Z-00000000'


def test_records_are_written_whole_read_in_order_and_bounded(tmp_path):
  for coordinated_id in (ID2, ID1, ID3):
    path = coordinated.write_record(str(tmp_path), _record(coordinated_id),
                                    keep=2)
    assert json.load(open(path))['id'] == coordinated_id
  assert [r['id'] for r in coordinated.read_records(str(tmp_path))] == [
      ID2, ID3]
  assert sorted(os.listdir(tmp_path / coordinated.RECORDS_DIR)) == [
      f'{ID2}.json', f'{ID3}.json']


def test_an_unreadable_record_is_skipped(tmp_path):
  coordinated.write_record(str(tmp_path), _record(ID1))
  (tmp_path / coordinated.RECORDS_DIR / f'{ID2}.json').write_text('{"id": ')
  assert [r['id'] for r in coordinated.read_records(str(tmp_path))] == [ID1]
  assert coordinated.read_records(str(tmp_path / 'none')) == []


@pytest.mark.parametrize('record, message', [
    (_record('ckpt-1'), "looks like '20261126T061500123456Z-0a1b2c3d', got "
     "'ckpt-1'"),
    ({'id': ID1, 'shards': []}, f'coordinated record {ID1} names no shards'),
])
def test_bad_records_are_refused(tmp_path, record, message):
  with pytest.raises(ValueError, match=message):
    coordinated.write_record(str(tmp_path), record)
  assert coordinated.read_records(str(tmp_path)) == []


def test_the_newest_record_every_shard_holds_and_can_load_wins():
  first, second, third = _record(ID1), _record(ID2), _record(ID3)
  # ID3 is only on shard 0 (a save killed while recording it).
  held = [[first, second, third], [first, second], [second, first]]
  assert coordinated.newest_common(held)['id'] == ID2
  # Shard 1 no longer holds its checkpoint of ID2: ID1 is the newest usable.
  assert coordinated.newest_common(
      held, [[ID1, ID2, ID3], [ID1], [ID1, ID2]])['id'] == ID1
  assert coordinated.newest_common([[third], [first]]) is None
  assert coordinated.newest_common([]) is None


def test_is_coordinated_reads_the_manifest_extra():
  assert coordinated.is_coordinated({'extra': {coordinated.EXTRA_KEY: ID1}})
  assert not coordinated.is_coordinated({'extra': {}})
  assert not coordinated.is_coordinated({})
