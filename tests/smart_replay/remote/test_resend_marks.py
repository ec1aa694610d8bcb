"""A served buffer answers its writers their marks in its newest checkpoint,
and, live, every item of theirs it holds (what re-sending after a restart
needs)."""

import pytest

import smart_replay
from smart_replay.control import client as control_client
from smart_replay.control import credentials as credentials_lib
from smart_replay.remote import replay_server as serve
from smart_replay.server import checkpointer
from smart_replay.storage import manifest as manifest_lib
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
