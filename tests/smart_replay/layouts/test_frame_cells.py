"""Frame stacks stored once: every stored window is what TF-Agents stores."""

import collections
import functools
import json
import os
import subprocess
import sys
import time
import types

import ale_py
import gymnasium as gym
import numpy as np
import pytest
import reverb
import tensorflow as tf
import tree
from tf_agents.replay_buffers import reverb_utils

import smart_replay
from smart_replay import FrameStack, ReplayBufferManager, TableConfig
from smart_replay.layouts import frame_cells
from smart_replay import layouts
from smart_replay.spec import specs
from smart_replay.storage import reader as reader_lib
from smart_replay.tools import export
from smart_replay.tools import inspection
from tests import testing
from tests.smart_replay.remote import remote_workers


_spec = testing.frame_spec
_step = testing.frame_step


def _pong(steps, *, axis, padding, episode_steps=90, seed=0):
  """Real ALE Pong frames as a TF-Agents driver writes them: FIRST/MID
  steps, the last transition, then the boundary step; episodes cut every
  `episode_steps` (random policy, sticky actions)."""
  gym.register_envs(ale_py)
  env = gym.make('ALE/Pong-v5', frameskip=1, repeat_action_probability=0.25)
  env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84)
  env = gym.wrappers.FrameStackObservation(env, 4, padding_type=padding)
  rng = np.random.default_rng(seed)
  shape = (lambda o: o) if axis == 0 else (lambda o: np.moveaxis(o, 0, -1))
  observation, _ = env.reset(seed=seed)
  current, count, made = 0, 0, []
  while len(made) < steps:
    action = int(rng.integers(6))
    if current == 2:  # The boundary step, then a new episode.
      made.append(_step(2, shape(np.asarray(observation)), action, 0))
      observation, _ = env.reset()
      current, count = 0, 0
      continue
    following, reward, terminated, truncated, _ = env.step(action)
    count += 1
    last = terminated or truncated or count == episode_steps
    made.append(_step(current, shape(np.asarray(observation)), action,
                      2 if last else 1, reward, 0.0 if terminated else 1.0))
    observation, current = following, 2 if last else 1
  env.close()
  return made


@functools.lru_cache(maxsize=None)
def _pong_windows(steps, axis, padding):
  """`(stream, windows)`: `_pong`'s steps and every window of 2 steps
  TF-Agents stores of them (made once per module: several tests share
  them)."""
  stream = _pong(steps, axis=axis, padding=padding)
  spec = _spec([4, 84, 84] if axis == 0 else [84, 84, 4])
  return stream, _stock_windows(spec, stream, 2)


def _stock_windows(spec, stream, length):
  """Every window TF-Agents' ReverbAddTrajectoryObserver stores."""
  table = reverb.Table('stock', max_size=10**6,
                       sampler=reverb.selectors.Fifo(),
                       remover=reverb.selectors.Fifo(), max_times_sampled=1,
                       rate_limiter=reverb.rate_limiters.MinSize(1))
  server = reverb.Server([table])
  client = reverb.Client(f'localhost:{server.port}')
  try:
    observer = reverb_utils.ReverbAddTrajectoryObserver(
        client, 'stock', sequence_length=length, stride_length=1)
    for step in stream:
      observer(step)
    observer.close()
    # Every item once (fifo, sampled once): no wait for an empty table.
    stored = client.server_info(timeout=60)['stock'].current_size
    dataset = reverb.TrajectoryDataset(
        client.server_address, 'stock',
        tf.nest.map_structure(lambda s: s.dtype, spec),
        tf.nest.map_structure(lambda s: tf.TensorShape([length] + s.shape),
                              spec),
        max_in_flight_samples_per_worker=8, num_workers_per_iterator=1,
        max_samples=stored, rate_limiter_timeout_ms=60_000)
    return collections.Counter(testing.item_fingerprint(
        tree.map_structure(lambda t: t.numpy(), sample.data))
                               for sample in dataset)
  finally:
    server.stop()


def _our_windows(manager, *tables):
  """Every window a fifo table read once holds, sampled through the
  manager's dataset, with unpadded content (as `testing.read_all_items`):
  a `Counter` for one table, `{table: Counter}` for several.

  Each table is read in one batch of all its items; the reads the datasets
  make past them wait for the timeout together, not once per table.
  """
  held = reverb.Client(manager.server_address).server_info(timeout=60)
  found, iterators = {}, []
  for table in tables:
    stored = held[table].current_size
    if not stored:
      found[table] = collections.Counter()
      continue
    iterators.append(iter(manager.get_dataset(
        batch_size=stored, table_name=table, sample_timeout_s=1.0,
        prefetch=1)))
    trajectory, info = next(iterators[-1])
    batch = tree.map_structure(lambda t: t.numpy(), trajectory)
    lengths = info.mask.numpy().sum(axis=1)
    found[table] = collections.Counter(
        testing.item_fingerprint(tree.map_structure(
            lambda t: t[b, :int(lengths[b])], batch))  # pylint: disable=cell-var-from-loop
        for b in range(stored))
  return found[tables[0]] if len(tables) == 1 else found


@pytest.mark.parametrize('axis, padding, codec', [
    (0, 'reset', 'zstd'), (-1, 'zero', 'zstd'), (-1, 'zero', 'zlib')])
def test_every_window_is_what_tf_agents_stores(tmp_path, axis, padding,
                                               codec):
  stream, expected = _pong_windows(400, axis, padding)
  spec = _spec([4, 84, 84] if axis == 0 else [84, 84, 4])
  assert sum(expected.values()) > 380
  manager = ReplayBufferManager(
      spec, capacity=10_000, checkpoint_dir=str(tmp_path / 'b'),
      sequence_length=2, frame_stack=FrameStack('observation', axis, codec),
      table_configs=[TableConfig(sampler='fifo', max_times_sampled=1)])
  try:
    _, observer = manager.create_replay_buffer()
    for step in stream:
      observer(step)
    observer.flush()
    assert _our_windows(manager, 'experience') == expected
  finally:
    manager.close()


_synthetic = testing.frame_stream


def _expected_windows(stream, length=3):
  """Every window of `length` steps inside one episode of `stream`."""
  expected, episode = collections.Counter(), []
  for step in stream:
    if step.step_type == 0:
      episode = []
    episode.append(step)
    if len(episode) >= length:
      expected[testing.item_fingerprint(tree.map_structure(
          lambda *x: np.stack(x), *episode[-length:]))] += 1
  return expected


_TABLES = [
    TableConfig(name='windows', sampler='fifo', max_times_sampled=1),
    TableConfig(name='strided', stride_length=2, sampler='fifo',
                max_times_sampled=1),
    TableConfig(name='episodes', kind='episode', episode_length=16,
                sampler='fifo', max_times_sampled=1),
    TableConfig(name='crossing', cross_episodes=True, sampler='fifo',
                max_times_sampled=1),
    TableConfig(name='prioritized', sampler='prioritized',
                max_times_sampled=1),
]


def _windows(tmp_path, name, stream, frame_stack, num_envs=None):
  manager = ReplayBufferManager(
      _spec([3, 6, 5]), capacity=10_000,
      checkpoint_dir=str(tmp_path / name), sequence_length=3,
      frame_stack=frame_stack, table_configs=_TABLES, num_envs=num_envs)
  try:
    _, observer = manager.create_replay_buffer()
    for step in stream:
      observer(step)
    observer.flush()
    return _our_windows(manager, *[t.name for t in _TABLES])
  finally:
    manager.close()


@pytest.mark.parametrize('num_envs', [None, 2])
def test_every_table_kind_stores_the_packed_layouts_windows(tmp_path,
                                                             num_envs):
  stream = _synthetic(300)
  if num_envs:  # Two environments: the stream and a shifted copy of it.
    other = _synthetic(300, seed=1)
    stream = [tree.map_structure(lambda *x: np.stack(x), a, b)
              for a, b in zip(stream, other)]
  plain = _windows(tmp_path, 'plain', stream, None, num_envs)
  stacked = _windows(tmp_path, 'stacked', stream, FrameStack('observation', 0),
                     num_envs)
  for name, found in plain.items():
    assert sum(found.values()) > 20, name
  assert stacked == plain


def _sampled(manager, stream, *, batches, batch_size):
  """Writes `stream`, then counts the windows of `batches` sampled batches;
  closes the manager."""
  try:
    _, observer = manager.create_replay_buffer()
    for step in stream:
      observer(step)
    observer.flush()
    iterator = iter(manager.get_dataset(batch_size=batch_size))
    seen = collections.Counter()
    for _ in range(batches):
      trajectory, _ = next(iterator)
      for b in range(batch_size):
        seen[testing.item_fingerprint(tree.map_structure(
            lambda t: t[b].numpy(), trajectory))] += 1  # pylint: disable=cell-var-from-loop
    return seen
  finally:
    manager.close()


@pytest.mark.parametrize('block_length, codec, windows_per_item', [
    (8, 'zstd', 1), (21, 'zstd', 1), (32, 'zstd', 4), (8, 'zlib', 1)])
def test_blocks_sample_only_stored_windows(tmp_path, block_length, codec,
                                           windows_per_item):
  stream = _synthetic(400)
  spec = _spec([3, 6, 5])
  valid = _expected_windows(stream)
  manager = ReplayBufferManager(
      spec, capacity=10_000, checkpoint_dir=str(tmp_path / 'b'),
      sequence_length=3, frame_stack=FrameStack('observation', 0, codec),
      table_configs=[TableConfig(block_length=block_length,
                                 windows_per_item=windows_per_item)])
  seen = _sampled(manager, stream, batches=40, batch_size=32)
  assert set(seen) <= set(valid)
  assert len(seen) > 0.8 * len(valid)  # 1,280 draws of ~330 windows.


@pytest.mark.parametrize('axis', [0, -1])
def test_pong_blocks_sample_what_tf_agents_stores(tmp_path, axis):
  # Real frames in zstd groups of 8: windows touching one group and two
  # (starts across a group boundary), both stack axes.
  stream, expected = _pong_windows(300, axis, 'reset')
  spec = _spec([4, 84, 84] if axis == 0 else [84, 84, 4])
  manager = ReplayBufferManager(
      spec, capacity=10_000, checkpoint_dir=str(tmp_path / 'b'),
      sequence_length=2, table_configs=[TableConfig(block_length=32)])
  assert manager.buffer_config['layout']['frame_stack'] == {
      'field': 'observation', 'axis': axis, 'codec': 'zstd'}  # Found.
  seen = _sampled(manager, stream, batches=30, batch_size=64)
  assert set(seen) <= set(expected)
  assert len(seen) > 0.9 * len(expected)  # 1,920 draws of ~290 windows.


_FIFO = [TableConfig(sampler='fifo', max_times_sampled=1)]


def _stacked_buffer(directory, stream, *,
                    frame_stack=FrameStack('observation', 0), **kwargs):
  """A frame-stacked buffer holding `stream` (windows of 3 steps)."""
  manager = ReplayBufferManager(
      _spec([3, 6, 5]), capacity=10_000, checkpoint_dir=str(directory),
      sequence_length=3, frame_stack=frame_stack, **kwargs)
  _, observer = manager.create_replay_buffer()
  for step in stream:
    observer(step)
  observer.flush()
  return manager


def _checkpointed(directory, stream, option):
  """`_stacked_buffer` of `option` and fifo items, checkpointed and closed;
  returns the checkpoint's path."""
  manager = _stacked_buffer(directory, stream, frame_stack=option,
                            table_configs=_FIFO)
  try:
    return manager.checkpoint()
  finally:
    manager.close()


def test_checkpoint_records_the_frame_stack_and_restores(tmp_path):
  stream = _synthetic(200)
  spec = _spec([3, 6, 5])
  option = FrameStack('observation', 0)
  path = _checkpointed(tmp_path / 'b', stream, option)
  stored = [item.columns for item in reader_lib.CheckpointReader(path).items()]
  fresh = ReplayBufferManager.from_checkpoint(str(tmp_path / 'b'))
  try:
    fresh.load_replay_buffer()
    assert fresh.buffer_config['layout']['frame_stack'] == option.describe()
    found = _our_windows(fresh, 'experience')
  finally:
    fresh.close()
  read = collections.Counter(testing.item_fingerprint(c) for c in stored)
  assert sum(found.values()) > 150
  assert found == read  # The reader rebuilds what the dataset samples.
  # Loading it as a buffer without the frame stack is refused.
  with pytest.raises(Exception, match='frame_stack'):
    ReplayBufferManager(spec, capacity=10_000,
                        checkpoint_dir=str(tmp_path / 'b'), sequence_length=3,
                        layout='packed', table_configs=_FIFO
                        ).load_replay_buffer()


@pytest.mark.unit
@pytest.mark.parametrize('option, message', [
    (FrameStack('pixels'), "FrameStack.field='pixels' is not a field"),
    (FrameStack('reward'), 'needs a uint8 field'),
    (FrameStack('observation', 1), 'must be the first'),
])
def test_bad_frame_stacks_are_named(option, message):
  with pytest.raises(ValueError, match=message):
    layouts.make_layout('packed', _spec([3, 6, 5]), option)


@pytest.mark.unit
def test_frame_stack_needs_the_packed_layout(tmp_path):
  with pytest.raises(ValueError, match="needs layout='packed'"):
    ReplayBufferManager(_spec([3, 6, 5]), capacity=10,
                        checkpoint_dir=str(tmp_path / 'b'), layout='columns',
                        frame_stack=FrameStack('observation', 0))


def test_epoch_export_and_inspect_read_whole_stacks(tmp_path):
  stream = _synthetic(200)
  spec = _spec([3, 6, 5])
  manager = ReplayBufferManager(
      spec, capacity=10_000, checkpoint_dir=str(tmp_path / 'b'),
      sequence_length=3, frame_stack=FrameStack('observation', 0))
  try:
    _, observer = manager.create_replay_buffer()
    for step in stream:
      observer(step)
    observer.flush()
    windows = collections.Counter()
    for trajectory, _ in manager.epoch(16, seed=0):
      for b in range(len(trajectory.step_type)):
        windows[testing.item_fingerprint(tree.map_structure(
            lambda t: t[b], trajectory))] += 1  # pylint: disable=cell-var-from-loop
    manager.checkpoint()
  finally:
    manager.close()
  expected = _expected_windows(stream)
  assert windows == expected
  result = export.export_npz(str(tmp_path / 'b'), str(tmp_path / 'out.npz'))
  with np.load(str(tmp_path / 'out.npz')) as data:
    observations = data['observation']
    following = data['next_observation']
  assert result.steps == len(observations) > 150
  stored = {s.observation.tobytes() for s in stream}
  assert all(o.tobytes() in stored for o in observations)
  pairs = {(a.observation.tobytes(), b.observation.tobytes())
           for a, b in zip(stream, stream[1:]) if a.step_type != 2}
  assert all((a.tobytes(), b.tobytes()) in pairs
             for a, b in zip(observations, following))
  described = inspection.describe_checkpoints(str(tmp_path / 'b'))
  assert described['frame_stack'] == {'field': 'observation', 'axis': 0,
                                      'codec': 'zstd'}
  assert 'frame_stack=(observation, axis 0' in inspection.format_text(
      described)


def test_a_starter_mixes_into_a_frame_stacked_buffer(tmp_path):
  """Both buffers' stacks are rebuilt byte for byte, each element from the
  buffer its `source` names, in the scheduled share."""
  starter_stream, online_stream = _synthetic(200, seed=4), _synthetic(200)
  starter = _stacked_buffer(tmp_path / 'starter', starter_stream)
  starter.checkpoint()
  starter.close()
  manager = _stacked_buffer(tmp_path / 'run', online_stream,
                            starter_dir=str(tmp_path / 'starter'))
  try:
    windows = {smart_replay.ONLINE: _expected_windows(online_stream),
               smart_replay.STARTER: _expected_windows(starter_stream)}
    iterator = iter(manager.get_dataset(batch_size=32, starter_fraction=0.25))
    sources = []
    for _ in range(40):
      trajectory, info = next(iterator)
      for b, source in enumerate(info.source.numpy()[:, 0].tolist()):
        window = testing.item_fingerprint(tree.map_structure(
            lambda t: t[b].numpy(), trajectory))  # pylint: disable=cell-var-from-loop
        assert window in windows[source]
        sources.append(source)
    share = np.mean(np.array(sources) == smart_replay.STARTER)
    assert abs(share - 0.25) < 5 * np.sqrt(0.25 * 0.75 / len(sources))
  finally:
    manager.close()


def test_a_standalone_server_serves_the_frame_stack(tmp_path):
  spec = _spec([3, 6, 5])
  spec_file = str(tmp_path / 'spec.pbtxt')
  specs.save_spec(spec_file, spec)
  port = remote_workers.free_port_pair()
  log_path = tmp_path / 'serve.log'
  with open(log_path, 'w') as log:
    process = subprocess.Popen(
        [sys.executable, '-m', 'smart_replay_scripts.serve',
         f'--spec_file={spec_file}', f'--checkpoint_dir={tmp_path / "b"}',
         f'--port={port}', '--gin_bindings=ReplayBufferManager.capacity=10000',
         '--gin_bindings=ReplayBufferManager.sequence_length=3',
         '--gin_bindings=ReplayBufferManager.frame_stack=@FrameStack()',
         '--gin_bindings=FrameStack.axis=0',
         '--gin_bindings=ReplayBufferManager.table_configs=[@TableConfig()]',
         "--gin_bindings=TableConfig.sampler='fifo'",
         '--gin_bindings=TableConfig.max_times_sampled=1'],
        stdout=log, stderr=subprocess.STDOUT, cwd=testing.ROOT)
  try:
    deadline = time.monotonic() + 120
    while 'Serving ' not in log_path.read_text():
      assert process.poll() is None, log_path.read_text()[-3000:]
      assert time.monotonic() < deadline, log_path.read_text()[-3000:]
      time.sleep(0.2)
    client = ReplayBufferManager(
        spec, server_address=f'localhost:{port}',
        control_token_file=str(tmp_path / 'b' / 'control.token'))
    try:
      _, observer = client.connect()
      assert client.buffer_config['layout']['frame_stack'] == {
          'field': 'observation', 'axis': 0, 'codec': 'zstd'}
      stream = _synthetic(120)
      for step in stream:
        observer(step)
      observer.flush()
      found = _our_windows(client, 'experience')
    finally:
      client.close()
  finally:
    process.kill()
    process.wait(60)
  expected = _expected_windows(stream)
  assert found == expected


def test_the_docs_snippet_runs(tmp_path, monkeypatch):
  with open(os.path.join(testing.ROOT, 'docs/pixels.md')) as f:
    section = f.read().split('## Pixel observations', 1)[1]
  snippet = section.split('```python\n', 1)[1].split('```', 1)[0]
  monkeypatch.chdir(tmp_path)
  agent = types.SimpleNamespace(collect_data_spec=_spec([84, 84, 4]))
  namespace = {'atari_agent': agent}
  exec(snippet, namespace)  # pylint: disable=exec-used
  manager = namespace['manager']
  try:
    assert manager.buffer_config['layout']['frame_stack'] == {
        'field': 'observation', 'axis': -1, 'codec': 'zstd'}
    assert namespace['observer'] is not None
  finally:
    manager.close()


def test_a_zlib_buffer_from_before_zstd_loads_and_samples(tmp_path):
  # A checkpoint whose manifest records a frame stack without a codec (as
  # every one written before zstd) is zlib, and reopens as one.
  stream = _synthetic(200)
  path = _checkpointed(tmp_path / 'b', stream,
                       FrameStack('observation', 0, codec='zlib'))
  manifest_path = os.path.join(path, 'manifest.json')
  with open(manifest_path) as f:
    manifest = json.load(f)
  del manifest['layout']['frame_stack']['codec']
  with open(manifest_path, 'w') as f:
    json.dump(manifest, f)
  fresh = ReplayBufferManager.from_checkpoint(str(tmp_path / 'b'))
  try:
    fresh.load_replay_buffer()
    assert fresh.buffer_config['layout']['frame_stack']['codec'] == 'zlib'
    found = _our_windows(fresh, 'experience')
  finally:
    fresh.close()
  assert found == _expected_windows(stream)


@pytest.mark.parametrize('codec', ['zstd', 'zlib'])
@pytest.mark.parametrize('batch', [(), (3,)])
def test_last_axis_stacks_are_cut_into_contiguous_frames(codec, batch):
  # zstd cuts with the op library's C function, zlib with numpy; both give
  # the frames oldest first, contiguous, for one step or a batch of them.
  field = frame_cells.StackedField(
      FrameStack('observation', -1, codec), _spec([84, 84, 4]))
  stack = np.random.default_rng(0).integers(0, 256, batch + (84, 84, 4),
                                            np.uint8)
  frames = field.frames(stack)
  assert frames.flags.c_contiguous and frames.shape == batch + (4, 84, 84)
  np.testing.assert_array_equal(frames, np.moveaxis(stack, -1, -3))
  np.testing.assert_array_equal(field.stacks(frames), stack)
  if not batch:  # A stream's encoder: a whole stack, then the newest frame
    # of a stack that continues it.
    encoder = frame_cells.StackEncoder()
    assert len(encoder.new_frames(frames)) == 4
    shifted = np.concatenate([stack[..., 1:], stack[..., :1] + 1], axis=-1)
    np.testing.assert_array_equal(encoder.new_frames(field.frames(shifted)),
                                  field.frames(shifted)[-1:])
    unrelated = field.frames(shifted + 1)
    assert len(encoder.new_frames(unrelated)) == 4


@pytest.mark.unit
@pytest.mark.parametrize('shape, dtype, found', [
    ([84, 84, 4], tf.uint8, ('observation', -1)),  # TF-Agents' FrameStack4.
    ([4, 84, 84], tf.uint8, ('observation', 0)),  # Gymnasium's.
    ([84, 84, 3], tf.uint8, None),  # One RGB frame.
    ([84, 84, 4], tf.float32, None),
    ([84, 84], tf.uint8, None),
    ([3, 6, 5], tf.uint8, None),  # Too small to be frames.
    ([4, 84, 4], tf.uint8, None),  # Either axis: ambiguous.
])
def test_frame_stacks_are_found_by_their_shape(shape, dtype, found):
  spec = _spec([1])._replace(observation=tf.TensorSpec(shape, dtype))
  detected = frame_cells.detect_frame_stack(spec)
  assert (detected and (detected.field, detected.axis)) == found
  if found:
    assert detected.codec == 'zstd'


@pytest.mark.unit
def test_the_found_frame_stack_is_recorded_and_can_be_turned_off(tmp_path):
  spec = _spec([84, 84, 4])
  found = ReplayBufferManager(spec, capacity=10,
                              checkpoint_dir=str(tmp_path / 'a'))
  off = ReplayBufferManager(spec, capacity=10, frame_stack=False,
                            checkpoint_dir=str(tmp_path / 'b'))
  columns = ReplayBufferManager(spec, capacity=10, layout='columns',
                                checkpoint_dir=str(tmp_path / 'c'))
  try:
    assert found.buffer_config['layout']['frame_stack'] == {
        'field': 'observation', 'axis': -1, 'codec': 'zstd'}
    assert 'frame_stack' not in off.buffer_config['layout']
    assert columns.buffer_config['layout'] == {'name': 'columns'}
  finally:
    for manager in (found, off, columns):
      manager.close()
  with pytest.raises(ValueError, match=r'frame_stack must be .* got 1'):
    ReplayBufferManager(spec, capacity=10, frame_stack=1,
                        checkpoint_dir=str(tmp_path / 'd'))


@pytest.mark.unit
def test_a_bad_codec_is_named():
  with pytest.raises(ValueError, match="codec must be one of .* got 'lz4'"):
    FrameStack('observation', 0, codec='lz4')


@pytest.mark.unit
def test_a_zstd_buffer_without_the_op_says_how_to_build_it(monkeypatch,
                                                           tmp_path):
  from smart_replay.config import buffer as config_lib  # pylint: disable=g-import-not-at-top
  from smart_replay.ops import build  # pylint: disable=g-import-not-at-top
  from smart_replay.ops import zstd  # pylint: disable=g-import-not-at-top
  stored = config_lib.BufferConfig.resolve(
      data_spec=_spec([84, 84, 4]), capacity=10, sequence_length=2,
      stride_length=1, table_configs=[TableConfig()]).to_manifest()
  monkeypatch.setattr(zstd, '_module', None)  # No prebuilt, no compiler.
  monkeypatch.setattr(zstd, 'prebuilt_path', lambda: str(tmp_path / 'no.so'))
  monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / 'cache'))
  monkeypatch.setenv('CXX', 'no-such-cxx')
  with pytest.raises(smart_replay.ZstdOpMissingError, match='make ops'):
    layouts.make_layout('packed', _spec([3, 6, 5]),
                        FrameStack('observation', 0))
  # A checkpoint that records zstd says so too, and so does a new buffer
  # whose frame stack is found.
  with pytest.raises(smart_replay.ZstdOpMissingError,
                     match=r'apt-get install g\+\+'):
    config_lib.BufferConfig.from_manifest(stored)
  with pytest.raises(smart_replay.ZstdOpMissingError):
    ReplayBufferManager(_spec([84, 84, 4]), capacity=10,
                        checkpoint_dir=str(tmp_path / 'b'))
  # zlib buffers keep working.
  layouts.make_layout('packed', _spec([3, 6, 5]),
                      FrameStack('observation', 0, codec='zlib'))
