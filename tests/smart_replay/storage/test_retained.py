"""What a remote writer keeps of what it sent, and what a re-send lost."""

import pytest

from smart_replay.storage import journal_records
from smart_replay.storage import retained as retained_lib
from smart_replay.writing import journaling
from smart_replay.writing import resending

pytestmark = pytest.mark.unit


def _kept(max_bytes):
  # Each record's payload names its items: b'<stream>,<table>,<n>'.
  def count_items(record):
    stream, table, n = record.payload.decode().split(',')
    return {(int(stream), table): int(n)}
  return retained_lib.RetainedRecords(
      writer_id='00000000000000ab', meta={'columns': []},
      max_bytes=max_bytes, count_items=count_items)


def test_numbers_bound_and_summaries():
  kept = _kept(max_bytes=30)
  seqs = [kept.append(journaling.CALL, f'0,t,{i % 3}'.encode())
          for i in range(1, 11)]
  assert seqs == list(range(1, 11)) and kept.next_seq == 11
  # 5 bytes each: the newest 6 fit in 30 bytes.
  assert [r.seq for r in kept.contents().records] == [5, 6, 7, 8, 9, 10]
  assert kept.bytes == 30 and kept.dropped_through == 4
  assert [(d.seq, d.items) for d in kept.dropped] == [
      (1, {(0, 't'): 1}), (2, {(0, 't'): 2}), (3, {(0, 't'): 0}),
      (4, {(0, 't'): 1})]
  assert kept.drop_through(7) == 3
  assert [r.seq for r in kept.contents().records] == [8, 9, 10]
  assert not kept.dropped  # A checkpoint holds them: no loss to count.
  assert kept.stats() == {'records': 3, 'bytes': 15, 'next_seq': 11,
                          'dropped_through': 7, 'dropped_for_memory': 4}
  kept.close()
  assert not kept.contents().records


def test_a_record_larger_than_the_bound_is_kept_alone():
  kept = _kept(max_bytes=4)
  kept.append(journaling.CALL, b'0,t,1')
  kept.append(journaling.CALL, b'0,t,2')
  assert [r.seq for r in kept.contents().records] == [2]


def test_lost_in_dropped_counts_what_the_server_lacks():
  kept = _kept(max_bytes=6)
  for payload in (b'0,t,1', b'0,t,2', b'0,t,3', b'0,t,1'):
    kept.append(journaling.CALL, payload)
  # Records 1-3 dropped; the server has everything below call 2 and one
  # item of it, and one item of call 3.
  lost, exact = resending.lost_in_dropped(
      kept.dropped, dropped_through=kept.dropped_through,
      floors={(0, 't'): (2, 1)}, held={(0, 't'): {3: 1}})
  assert lost == {'t': 1 + 2} and exact
  lost, exact = resending.lost_in_dropped(
      [], dropped_through=3, floors={(0, 't'): (1, 1)}, held={})
  assert lost == {} and not exact  # Their summaries are gone.


def test_arguments_are_checked():
  for bad in (0, -1, 1.5, True):
    with pytest.raises(ValueError, match='max_bytes must be a positive'):
      _kept(bad)
  with pytest.raises(ValueError, match='writer_id'):
    retained_lib.RetainedRecords(writer_id='X', meta={}, max_bytes=1,
                                 count_items=dict)


def test_a_kept_record_is_a_copy_read_back_as_a_record():
  kept = _kept(max_bytes=100)
  payload = bytearray(b'0,t,1')
  kept.append(journaling.CALL, payload)
  payload[:] = b'0,t,9'  # The caller's buffer changes afterwards.
  record, = kept.contents().records
  assert isinstance(record, journal_records.Record)
  assert (record.seq, record.kind, record.payload) == (
      1, journaling.CALL, b'0,t,1')
