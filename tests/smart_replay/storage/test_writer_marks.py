"""Writer ids on stored steps, and each writer's marks read from checkpoints."""

import collections

import numpy as np
import pytest
import tree

import smart_replay
from smart_replay import layouts
from smart_replay.layouts import packed_steps
from smart_replay.server import checkpointer
from smart_replay.storage import reader as checkpoint_reader
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import writer_marks
from tests import testing


def _layout(path):
  return layouts.layout_from_manifest(
      manifest_lib.read(f'{path}/{manifest_lib.MANIFEST_NAME}'))


def _brute_force_marks(path, layout, tables):
  """Every item's every step read back: per (table, writer, stream), the
  newest call an item ends at and how many items end there."""
  raw = checkpoint_reader.CheckpointReader(
      path, packed_steps.Layout('columns', layout.step_spec))
  ends = collections.defaultdict(collections.Counter)
  for table in tables:
    for item in raw.items(table):
      writers, streams, seqs = (np.atleast_1d(a).reshape(-1) for a in
                                layout.read_ids(item.columns[0]))
      real = writers != 0
      last = np.flatnonzero(real)[np.argmax(seqs[real])]
      ends[(table, f'{writers[last]:016x}', str(streams[last]))][
          int(seqs[last])] += 1
  marks = {table: {} for table in tables}
  for (table, writer, stream), counts in ends.items():
    seq = max(counts)
    marks[table].setdefault(writer, {})[stream] = [seq, counts[seq]]
  return marks


def test_codec_stamps_and_reads_ids_and_decoding_ignores_them(data_spec):
  plain = packed_steps.StepCodec(data_spec)
  codec = packed_steps.StepCodec(data_spec, ids=True)
  assert codec.bytes_per_step == plain.bytes_per_step + packed_steps.IDS_BYTES
  assert codec.describe()['writer_ids'] == {
      'offset': plain.bytes_per_step, 'nbytes': packed_steps.IDS_BYTES}
  assert 'writer_ids' not in plain.describe()
  step = [np.full(s.shape, 3, s.dtype.as_numpy_dtype)
          for s in tree.flatten(data_spec)]
  row = codec.pack(step)
  assert not row[plain.bytes_per_step:].any()  # Zero until stamped.
  codec.stamp_ids(row, 0xfedcba9876543210, 77)
  np.testing.assert_array_equal(row[:plain.bytes_per_step], plain.pack(step))
  assert [int(a) for a in codec.read_ids(row)] == [0xfedcba9876543210, 0, 77]
  batch = codec.pack([np.stack([v, v, v]) for v in step])
  codec.stamp_ids(batch, 5, 2**48 - 1)
  writers, streams, seqs = codec.read_ids(batch)
  assert list(writers) == [5] * 3 and list(streams) == [0, 1, 2]
  assert list(seqs) == [2**48 - 1] * 3
  want = plain.unpack(plain.pack([np.stack([v] * 3) for v in step]))
  for got, expected in zip(tree.flatten(codec.unpack(batch)),
                           tree.flatten(want)):
    np.testing.assert_array_equal(got, expected)
  with pytest.raises(ValueError, match=r'seq must be in \[0, 2\*\*48\)'):
    codec.stamp_ids(row, 5, 2**48)
  with pytest.raises(ValueError, match='without ids=True'):
    plain.stamp_ids(plain.pack(step), 5, 1)
  with pytest.raises(ValueError, match="writer ids need layout='packed'"):
    packed_steps.Layout('columns', data_spec, ids=True)


def test_manifest_marks_are_each_writers_last_stored_call(make_manager):
  manager = make_manager(capacity=60, table_configs=[
      smart_replay.TableConfig('experience'),
      smart_replay.TableConfig('triples', sequence_length=3, max_size=1000),
      smart_replay.TableConfig('blocks', sequence_length=2, block_length=8,
                               max_size=1000)])
  _, first = manager.create_replay_buffer()
  second = manager.make_observer()
  assert first.writer_id != second.writer_id
  calls = len(testing.run_actor(first, 90, seed=1).steps)
  second_calls = len(testing.run_actor(second, 40, seed=2).steps)
  calls += len(testing.run_actor(first, 7, seed=3).steps)
  unmarked = manager.checkpoint()  # Only asked for (a served buffer asks).
  assert checkpointer.WRITER_MARKS_KEY not in manifest_lib.read(
      f'{unmarked}/{manifest_lib.MANIFEST_NAME}')['counts']
  path = manager.checkpoint(writer_marks=True)
  stored = manifest_lib.read(f'{path}/{manifest_lib.MANIFEST_NAME}')
  layout = layouts.layout_from_manifest(stored)
  assert layout.writer_ids
  marks = stored['counts'][checkpointer.WRITER_MARKS_KEY]
  tables = ['experience', 'triples', 'blocks']
  assert marks == _brute_force_marks(path, layout, tables)
  assert marks == writer_marks.read(path, layout)
  items = writer_marks.read_items(path, layout)
  for table in tables:
    for writer, streams in items[table].items():
      for stream, seqs in streams.items():
        assert seqs == sorted(seqs)
        assert marks[table][writer][stream] == [seqs[-1],
                                                seqs.count(seqs[-1])]
  assert len(items['triples'][first.writer_id]['0']) == sum(
      1 for _ in checkpoint_reader.CheckpointReader(path).items('triples')
  ) - len(items['triples'][second.writer_id]['0'])
  # The experience table (FIFO of 60) still holds the first observer's last
  # items: its mark is its last call that completed one (a call that starts
  # an episode completes none), numbered from 1.
  seq, items = marks['experience'][first.writer_id]['0']
  assert seq in (calls, calls - 1) and items == 1
  assert marks['triples'][second.writer_id]['0'][0] in (
      second_calls, second_calls - 1)
  # A flush before the checkpoint completed the open blocks.
  assert marks['blocks'][first.writer_id]['0'][0] in (calls, calls - 1)
  # Packed items are listed by window: a block by its last `windows` rows.
  windows = sum(int(round(item.priority)) for item in
                checkpoint_reader.CheckpointReader(path).items('blocks'))
  listed = writer_marks.read_items(path, layout)['blocks']
  assert sum(len(seqs) for streams in listed.values()
             for seqs in streams.values()) == windows
  for streams in listed.values():
    assert all(len(set(seqs)) == len(seqs) for seqs in streams.values())


def test_batched_streams_and_journal_ids(make_manager, data_spec):
  manager = make_manager(num_envs=2, journal='always')
  _, observer = manager.create_replay_buffer()
  assert observer.writer_id == observer.journal.writer_id
  recorder = testing.run_actor(testing.Recorder(), 30,
                               env=testing.make_env(4))
  for one in recorder.steps:
    observer(tree.map_structure(lambda x: np.stack([x, x]), one))
  path = manager.checkpoint(writer_marks=True)
  marks = writer_marks.read(path, _layout(path))
  mine = marks['experience'][observer.writer_id]
  assert set(mine) == {'0', '1'}
  assert mine['0'] == mine['1']
  assert mine['0'][1] == 1
  # The journal's record numbers are the sequence numbers.
  assert mine['0'][0] <= observer.journal.next_seq - 1


def test_old_layouts_have_no_ids_and_marks_need_them(make_manager):
  manager = make_manager(layout='columns')
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 10)
  path = manager.checkpoint(writer_marks=True)
  layout = _layout(path)
  assert not layout.writer_ids
  stored = manifest_lib.read(f'{path}/{manifest_lib.MANIFEST_NAME}')
  assert checkpointer.WRITER_MARKS_KEY not in stored['counts']
  with pytest.raises(ValueError, match='stores no writer ids'):
    writer_marks.read(path, layout)
