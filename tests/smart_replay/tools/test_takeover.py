"""Taking over a buffer written exactly as the original buffer manager writes it."""

import os
import shutil

import pytest
import reverb
import tensorflow as tf
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.replay_buffers import reverb_utils
from tf_agents.specs import tensor_spec

import smart_replay
from smart_replay.storage import foreign
from smart_replay.storage import reader as checkpoint_reader
from smart_replay.tools import takeover
from tests import testing

TABLE = 'uniform_table'  # The original tool's table.


def _original_buffer(root, data_spec, steps=120, sequence_length=2,
                     signature=False):
  """A buffer written with the original tool's calls; returns its items.

  A plain `reverb.Table` without a signature, a `DefaultCheckpointer` on
  the buffer directory, TF-Agents' `ReverbReplayBuffer` and
  `ReverbAddTrajectoryObserver`, and `py_client.checkpoint()`.
  """
  table = reverb.Table(
      TABLE, max_size=50_000, sampler=reverb.selectors.Uniform(),
      remover=reverb.selectors.Fifo(),
      rate_limiter=reverb.rate_limiters.MinSize(1),
      signature=tensor_spec.add_outer_dim(data_spec, sequence_length)
      if signature else None)
  server = reverb.Server(
      [table], checkpointer=reverb.checkpointers.DefaultCheckpointer(
          path=str(root)))
  try:
    replay_buffer = reverb_replay_buffer.ReverbReplayBuffer(
        data_spec, table_name=TABLE, sequence_length=sequence_length,
        local_server=server)
    observer = reverb_utils.ReverbAddTrajectoryObserver(
        replay_buffer.py_client, TABLE, sequence_length=sequence_length,
        stride_length=1)
    testing.run_actor(observer, steps)
    observer.close()
    path = replay_buffer.py_client.checkpoint()
  finally:
    server.stop()
  return path, [(round(item.priority, 6), testing.item_fingerprint(
      checkpoint_reader.unflatten(data_spec, item.columns)))
                for item in checkpoint_reader.CheckpointReader(path).items()]


def test_a_buffer_of_the_original_tool_is_taken_over_item_for_item(
    tmp_path, data_spec):
  path, stored = _original_buffer(tmp_path / 'original', data_spec)
  result = takeover.import_reverb_checkpoint(
      str(tmp_path / 'original'), str(tmp_path / 'ours'), data_spec=data_spec)
  assert (result.source, result.table, result.items, result.sequence_length
          ) == (path, TABLE, len(stored), 2)
  imported = [(round(item.priority, 6), testing.item_fingerprint(
      checkpoint_reader.unflatten(data_spec, item.columns)))
              for item in checkpoint_reader.CheckpointReader(
                  result.checkpoint).items()]
  assert imported == stored  # Every item, in insertion order, same priority.
  with smart_replay.ReplayBufferManager(
      data_spec, capacity=50_000, checkpoint_dir=str(tmp_path / 'ours'),
      sequence_length=2) as manager:
    manager.load_replay_buffer()
    assert manager.num_frames() == len(stored)
    assert manager.loaded_manifest['extra']['imported_from'] == path
    sampled = testing.sample_all_items(manager)
    assert sorted(sampled.values()) == sorted(f for _, f in stored)


def test_loading_a_plain_reverb_checkpoint_names_the_import(tmp_path,
                                                            data_spec):
  path, _ = _original_buffer(tmp_path / 'original', data_spec, steps=30)
  manager = smart_replay.ReplayBufferManager(
      data_spec, capacity=100, checkpoint_dir=str(tmp_path / 'ours'))
  for source in (tmp_path / 'original', path):
    with pytest.raises(smart_replay.errors.ForeignCheckpointError,
                       match=r'is a plain Reverb checkpoint.*'
                       r'import_reverb_checkpoint\(source, checkpoint_dir'):
      manager.load_replay_buffer(str(source))
  manager.close()


def test_a_spec_that_is_not_stored_is_named_field_by_field(tmp_path,
                                                           data_spec):
  _original_buffer(tmp_path / 'original', data_spec, steps=30)
  other = data_spec._replace(reward=tf.TensorSpec([2], tf.float32, 'reward'))
  with pytest.raises(smart_replay.errors.TrajectorySpecError,
                     match=r"field 'reward': stored float32\[\], data_spec "
                     r'float32\[2\]'):
    takeover.import_reverb_checkpoint(str(tmp_path / 'original'),
                                      str(tmp_path / 'ours'),
                                      data_spec=other)
  assert not os.path.exists(tmp_path / 'ours' / 'checkpoints')
  takeover.import_reverb_checkpoint(str(tmp_path / 'original'),
                                    str(tmp_path / 'x'), data_spec=data_spec)
  with pytest.raises(ValueError, match='is a smart_replay buffer'):
    takeover.import_reverb_checkpoint(str(tmp_path / 'x'),
                                      str(tmp_path / 'y'), data_spec=data_spec)


def test_a_table_with_a_signature_is_checked_against_it(tmp_path, data_spec):
  _, stored = _original_buffer(tmp_path / 'original', data_spec, steps=30,
                               signature=True)
  other = data_spec._replace(discount=tf.TensorSpec([], tf.float64,
                                                    'discount'))
  with pytest.raises(smart_replay.errors.TrajectorySpecError,
                     match=r"field 'discount': stored float32\[\], data_spec "
                     r'float64\[\]'):
    takeover.import_reverb_checkpoint(str(tmp_path / 'original'),
                                      str(tmp_path / 'bad'), data_spec=other)
  result = takeover.import_reverb_checkpoint(
      str(tmp_path / 'original'), str(tmp_path / 'ours'), data_spec=data_spec)
  assert result.items == len(stored)


@pytest.mark.unit
def test_the_newest_checkpoint_is_chosen_by_the_time_in_its_name(tmp_path):
  def fake(name):
    os.makedirs(tmp_path / name)
    for file in ('tables.tfrecord', 'items.tfrecord', 'chunks.tfrecord',
                 'DONE'):
      (tmp_path / name / file).write_bytes(b'')
  # 10:00 at +05:00 is 05:00 UTC: older, though its name sorts last.
  fake('2026-01-01T10:00:00.5+05:00')
  fake('2026-01-01T06:00:00.000000001+00:00')
  fake('not-a-time')
  found = foreign.foreign_checkpoints(str(tmp_path))
  assert [os.path.basename(p) for _, p in found] == [
      '2026-01-01T06:00:00.000000001+00:00', '2026-01-01T10:00:00.5+05:00']
  assert found[0][0] - found[1][0] == 3600 * 10**9 - 5 * 10**8 + 1
  assert foreign.folder_time('2026-01-01T06:00:00Z') == found[0][0] - 1
  assert foreign.newest_foreign(str(tmp_path)).endswith('+00:00')
  shutil.rmtree(tmp_path / '2026-01-01T06:00:00.000000001+00:00')
  with pytest.raises(smart_replay.errors.ForeignCheckpointError,
                     match='2026-01-01T10:00:00.5'):
    foreign.refuse_foreign(str(tmp_path))
