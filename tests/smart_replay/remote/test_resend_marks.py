"""A served buffer answers its writers their marks in its newest checkpoint,
and, live, every item of theirs it holds (what re-sending after a restart
needs)."""

import collections

import pytest
import tree

import smart_replay
from smart_replay.control import client as control_client
from smart_replay.control import credentials as credentials_lib
from smart_replay.layouts import packed_items
from smart_replay.remote import replay_server as serve
from smart_replay.server import checkpointer
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import reader as checkpoint_reader
from smart_replay.utils import ports
from tests import testing


def _serve(buffer_dir, data_spec):
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec, capacity=1000, sequence_length=2,
      checkpoint_dir=str(buffer_dir))
  return serve.ReplayServer(manager, control_port=None).start()


def _reader(server):
  return control_client.ControlClient(
      f'localhost:{server.control_port}',
      credentials=credentials_lib.ClientCredentials.resolve(
          token_file=server.reader_token_file, environ={}))


def _restart_then_resend(server, serve_again, client, observer):
  """Stops `server` without its final checkpoint and starts it again on
  the same folder and ports (what a kill and a restart leave); the client
  sends again what it lacks, losing nothing. Returns the new server."""
  observer.flush()  # Stored, in no checkpoint.
  server.close(final_checkpoint=False)
  server = serve_again()
  client.flush()  # Sees the restart, sends again what it lacks.
  assert observer.num_resent_items > 0
  assert observer.num_lost_items == 0
  return server


def test_a_restarted_server_answers_each_writer_its_restored_marks(
    tmp_path, data_spec):
  server = _serve(tmp_path / 'buffer', data_spec)
  writers = []
  try:
    client = smart_replay.ReplayBufferManager(
        data_spec=data_spec, server_address=server.manager.server_address,
        control_address=f'localhost:{server.control_port}',
        control_token_file=server.token_file, sample_timeout_s=5.0,
        write_timeout_s=5.0)
    _, observer = client.connect()
    other = client.make_observer()
    testing.run_actor(observer, 30, seed=1)
    testing.run_actor(other, 12, seed=2)
    writers = [observer.writer_id, other.writer_id]
    reader = _reader(server)
    # No checkpoint yet: no marks to answer.
    answer = reader.call('writer_marks', {'writer_id': writers[0]},
                         timeout_s=10)
    assert answer == {'checkpoint': None, 'number': None, 'marks': None,
                      'instance': answer['instance']}
    reader.close()
    client.close()
  finally:
    final = server.close()
  stored = manifest_lib.read(f'{final}/{manifest_lib.MANIFEST_NAME}')
  marks = stored['counts'][checkpointer.WRITER_MARKS_KEY]
  assert set(marks['experience']) == set(writers)

  server = _serve(tmp_path / 'buffer', data_spec)
  try:
    reader = _reader(server)
    for writer in writers:
      answer = reader.call('writer_marks', {'writer_id': writer},
                           timeout_s=10)
      assert answer == {'checkpoint': final, 'number': int(final[-6:]),
                        'marks': {'experience': marks['experience'][writer]},
                        'instance': answer['instance']}
      live = reader.call('writer_marks', {'writer_id': writer, 'live': True},
                         timeout_s=30)
      assert live['checkpoint'] == final  # The one it restored.
      held = live['held']['experience']['0']
      assert [held[-1], held.count(held[-1])] == marks['experience'][writer][
          '0']
    assert reader.call('writer_marks', {'writer_id': '0' * 16},
                       timeout_s=10)['marks'] == {'experience': {}}
    with pytest.raises(ValueError, match='above must be an integer'):
      reader.call('writer_marks', {'writer_id': writers[0], 'live': True,
                                   'above': -1}, timeout_s=10)
    for bad in ('../x', 'ABCDEF0123456789', 7, None):
      with pytest.raises(ValueError,
                         match='writer_id must be 16 lower-case hex'):
        reader.call('writer_marks', {'writer_id': bad}, timeout_s=10)
    reader.close()
  finally:
    server.close(final_checkpoint=False)


def test_a_frame_stacked_client_sends_its_cells_again(tmp_path):
  # A ReplayServer stopped without its final checkpoint and started again
  # on the same folder and ports (what a kill and a restart leave): the
  # client's observer sends the cells the restored checkpoint lacks again,
  # and the buffer holds every window once, its stacks byte for byte.
  spec = testing.frame_spec([3, 6, 5])
  port = ports.free_port_pair()

  def serve_frames():
    manager = smart_replay.ReplayBufferManager(
        data_spec=spec, capacity=1000, sequence_length=2,
        checkpoint_dir=str(tmp_path / 'buffer'), port=port,
        frame_stack=smart_replay.FrameStack('observation', 0))
    return serve.ReplayServer(manager).start()

  steps = testing.frame_stream(60, seed=3)
  server = serve_frames()
  client = smart_replay.ReplayBufferManager(
      data_spec=spec, server_address=f'localhost:{port}',
      control_token_file=server.token_file, sample_timeout_s=5.0,
      write_timeout_s=5.0, restart_check_s=3600.0)
  try:
    _, observer = client.connect()
    assert observer.retains
    for step in steps[:30]:
      observer(step)
    client.checkpoint()
    for step in steps[30:]:
      observer(step)
    server = _restart_then_resend(server, serve_frames, client, observer)
  finally:
    client.close()
  final = server.close()
  stored = collections.Counter(
      testing.item_fingerprint(item.columns)
      for item in checkpoint_reader.CheckpointReader(final).items(
          'experience'))
  want = collections.Counter(
      testing.item_fingerprint(tree.flatten(item))
      for item in testing.expected_items(steps, 2))
  assert stored == want


@pytest.mark.parametrize('frames', [False, True], ids=['packed', 'frames'])
def test_a_client_sends_again_the_windows_of_packed_items_a_server_lacks(
    tmp_path, data_spec, frames):
  # Blocks of packed items: the restarted server lacks the blocks written
  # after its checkpoint, and the ones open then; the client packs the
  # windows it lacks into new blocks, so the buffer holds every window
  # once (windows of 3 steps: a new block repeats 2 rows).
  port = ports.free_port_pair()
  length = 2 if frames else 3
  spec = testing.frame_spec([3, 6, 5]) if frames else data_spec
  options = dict(frame_stack=smart_replay.FrameStack('observation', 0)
                 ) if frames else {}

  def serve_blocks():
    manager = smart_replay.ReplayBufferManager(
        data_spec=spec, capacity=1000, sequence_length=length,
        checkpoint_dir=str(tmp_path / 'buffer'), port=port,
        table_configs=[smart_replay.TableConfig(block_length=8)], **options)
    return serve.ReplayServer(manager).start()

  server = serve_blocks()
  client = smart_replay.ReplayBufferManager(
      data_spec=spec, server_address=f'localhost:{port}',
      control_token_file=server.token_file, sample_timeout_s=5.0,
      write_timeout_s=5.0, restart_check_s=3600.0)
  steps = testing.frame_stream(80, seed=4) if frames else []
  try:
    _, observer = client.connect()
    assert observer.retains
    if frames:
      for step in steps[:37]:
        observer(step)
    else:
      testing.run_actor(lambda t: (steps.append(t), observer(t)), 37, seed=4)
    client.checkpoint()  # Mid-block: the open blocks are in no checkpoint.
    if frames:
      for step in steps[37:]:
        observer(step)
    else:
      testing.run_actor(lambda t: (steps.append(t), observer(t)), 43, seed=5)
    server = _restart_then_resend(server, serve_blocks, client, observer)
  finally:
    client.close()
  final = server.close()
  reader = checkpoint_reader.CheckpointReader(final)
  stored = collections.Counter(
      testing.item_fingerprint(window.columns)
      for window in packed_items.window_items(
          list(reader.items()), length))
  want = collections.Counter(
      testing.item_fingerprint(tree.flatten(item))
      for item in testing.expected_items(steps, length))
  assert stored == want
