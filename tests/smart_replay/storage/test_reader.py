"""Reading a checkpoint's items and steps from its files, without a server."""

import os

import numpy as np
import pytest
import reverb

import smart_replay
from smart_replay.storage import reader as checkpoint_reader
from tests import testing


def _fingerprints(data_spec, items):
  return [testing.item_fingerprint(checkpoint_reader.unflatten(
      data_spec, item.columns)) for item in items]


def test_items_once_in_insertion_order_after_eviction(make_manager,
                                                      data_spec):
  manager = make_manager(capacity=40)
  _, observer = manager.create_replay_buffer()
  record = testing.run_actor(observer, 150, seed=3)
  path = manager.checkpoint()
  reader = checkpoint_reader.CheckpointReader(path)
  assert reader.tables() == {'experience': 40}
  want = testing.expected_items(record.steps, 2)[-40:]  # FIFO kept these.
  items = list(reader.items('experience'))
  assert _fingerprints(data_spec, items) == [testing.item_fingerprint(w)
                                             for w in want]
  assert len({item.key for item in items}) == 40
  assert all(item.times_sampled == 0 for item in items)


def test_pieces_rebuild_the_stored_steps_of_each_episode(make_manager,
                                                         data_spec):
  manager = make_manager(capacity=1000)
  _, observer = manager.create_replay_buffer()
  record = testing.run_actor(observer, 80, seed=5)
  reader = checkpoint_reader.CheckpointReader(manager.checkpoint())
  episodes, episode = [], []
  for step in record.steps:
    episode.append(step)
    if step.is_boundary():
      episodes.append(episode)
      episode = []
  if len(episode) >= 2:
    episodes.append(episode)
  pieces = reader.pieces('experience')
  assert [p.start for p in pieces] == [0] * len(episodes)
  assert [[testing.item_fingerprint(s) for s in e] for e in episodes] == [
      [testing.item_fingerprint(checkpoint_reader.unflatten(
          data_spec, [c[i] for c in p.columns])) for i in range(p.num_steps)]
      for p in pieces]


def test_delta_encoded_chunks_are_decoded(tmp_path):
  # Reverb's legacy writer delta-encodes integer columns when asked.
  server = reverb.Server([reverb.Table(
      't', reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
      reverb.rate_limiters.MinSize(1))],
      checkpointer=reverb.checkpointers.DefaultCheckpointer(str(tmp_path)))
  try:
    client = reverb.Client(f'localhost:{server.port}')
    with client.writer(max_sequence_length=3, delta_encoded=True,
                       chunk_length=3) as writer:
      for i in range(6):
        # Reverb delta-encodes only the integer field of rank >= 2 in a
        # chunk; floats, bools and per-step integer scalars stay as they are.
        writer.append((np.array([i * 7, -i], np.int64), np.float32(i + 0.5),
                       np.bool_(i % 2), np.int32(10 + i)))
        if i >= 2:
          writer.create_item('t', 3, 1.0)
    path = client.checkpoint()
  finally:
    server.stop()
  items = list(checkpoint_reader.CheckpointReader(path).items())
  for item, j in zip(items, range(2, 6)):
    steps = range(j - 2, j + 1)
    assert item.columns[0].tolist() == [[i * 7, -i] for i in steps]
    assert item.columns[1].tolist() == [i + 0.5 for i in steps]
    assert item.columns[2].tolist() == [bool(i % 2) for i in steps]
    assert item.columns[3].tolist() == [10 + i for i in steps]
  assert len(items) == 4


def test_incomplete_or_damaged_checkpoints_are_named(make_manager, tmp_path):
  with pytest.raises(smart_replay.CheckpointCorruptError, match='missing'):
    checkpoint_reader.CheckpointReader(str(tmp_path))
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 30)
  path = manager.checkpoint()
  with open(os.path.join(path, 'items.tfrecord'), 'r+b') as f:
    f.seek(20)
    f.write(b'garbage!')
  with pytest.raises(smart_replay.CheckpointCorruptError, match=path):
    checkpoint_reader.CheckpointReader(path)


def test_an_empty_table_is_listed_and_yields_nothing(make_manager):
  manager = make_manager()
  manager.create_replay_buffer()
  reader = checkpoint_reader.CheckpointReader(manager.checkpoint())
  assert reader.tables() == {'experience': 0}
  assert list(reader.items('experience')) == []
  assert reader.pieces('experience') == []
  assert reader.priorities('experience') == []
  with pytest.raises(ValueError, match="'other' is not in"):
    reader.priorities('other')
