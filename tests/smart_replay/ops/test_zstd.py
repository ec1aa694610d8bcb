"""The zstd op (`smart_replay.ops.zstd`): round trips, tf.data, bad blobs.

Runs the real compiled op: the module fixture loads it (a prebuilt one, or
the per-user cached build, compiled on first use; test_build.py tests how).
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from smart_replay.ops import build
from smart_replay.ops import zstd
from tests import testing

_MAGIC = b'\x28\xb5\x2f\xfd'


@pytest.fixture(scope='module', autouse=True)
def _built_op():
  zstd.require()


def _random_bytes(rng, size):
  return rng.integers(0, 256, size, dtype=np.uint8).tobytes()


def _smooth_frames(rng, count, size=84):
  """Frame-like uint8 images: upsampled coarse noise, flat regions, edges."""
  coarse = rng.integers(0, 256, (count, size // 12, size // 12),
                        dtype=np.uint8)
  frames = np.repeat(np.repeat(coarse, 12, axis=1), 12, axis=2)
  frames[:, 40:44, 10:30] = 236  # A paddle-like bar in every frame.
  return np.ascontiguousarray(frames)


def _encoded(values, level=3):
  return zstd.encode(tf.constant(values, tf.string), level=level).numpy()


def _refused(blobs, match, **kwargs):
  """Decoding `blobs` raises an InvalidArgumentError matching `match`."""
  with pytest.raises(tf.errors.InvalidArgumentError, match=match):
    zstd.decode(tf.constant(blobs, tf.string), **kwargs).numpy()


@pytest.mark.parametrize('shape', [(), (0,), (1,), (7,), (2, 3), (2, 0, 4)])
def test_round_trip_random_bytes(shape):
  rng = np.random.default_rng(sum(shape) + len(shape))
  count = int(np.prod(shape, dtype=np.int64))
  values = [_random_bytes(rng, int(n)) for n in rng.integers(0, 5000, count)]
  if count:
    values[0] = b''  # Empty data round-trips too.
  data = np.array(values, dtype=object).reshape(shape)
  blobs = zstd.encode(tf.constant(data, tf.string))
  assert blobs.shape == shape
  decoded = zstd.decode(blobs)
  assert decoded.shape == shape
  assert np.asarray(decoded.numpy(), object).tolist() == data.tolist()


def test_round_trip_frame_groups():
  rng = np.random.default_rng(1)
  frames = _smooth_frames(rng, 32)
  groups = frames.reshape(4, 8, 84, 84)  # 4 groups of 8 frames.
  blobs = _encoded([group.tobytes() for group in groups])
  assert all(len(blob) < 8 * 84 * 84 // 4 for blob in blobs)
  raw = tf.io.decode_raw(zstd.decode(blobs), tf.uint8)
  np.testing.assert_array_equal(tf.reshape(raw, [4, 8, 84, 84]).numpy(),
                                groups)
  # A scalar blob: one group.
  scalar = zstd.decode(tf.constant(blobs[2]))
  assert scalar.shape == ()
  np.testing.assert_array_equal(
      np.frombuffer(scalar.numpy(), np.uint8).reshape(8, 84, 84), groups[2])


@pytest.mark.parametrize('level', [-5, 0, 1, 3, 19])
def test_levels_round_trip(level):
  frames = _smooth_frames(np.random.default_rng(level + 10), 8).tobytes()
  blob = _encoded([frames], level=level)[0]
  assert zstd.decode(blob).numpy() == frames


def test_extreme_levels_accepted():
  data = b'tiny payload ' * 20
  for level in (-131072, 22):
    assert zstd.decode(_encoded(data, level=level)).numpy() == data


def test_frames_record_size_and_checksum():
  blob = _encoded(b'x' * 1000)
  assert blob[:4] == _MAGIC
  descriptor = blob[4]
  assert descriptor & 0x04, 'content checksum flag'
  assert descriptor & 0x20 or descriptor >> 6, 'content size recorded'


def test_in_tf_function_keeps_static_shape():
  @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.string)])
  def round_trip(data):
    return zstd.decode(zstd.encode(data), max_size=1 << 20)

  graph = round_trip.get_concrete_function()
  assert graph.outputs[0].shape.as_list() == [None, 3]
  data = [[b'a', b'', b'b' * 999], [b'c', b'dd', b'e' * 70000]]
  assert round_trip(tf.constant(data)).numpy().tolist() == data


def test_parallel_tf_data_map():
  rng = np.random.default_rng(2)
  frames = _smooth_frames(rng, 64 * 4)
  groups = [frames[i:i + 4].tobytes() for i in range(0, len(frames), 4)]
  blobs = _encoded(groups)
  dataset = (tf.data.Dataset.from_tensor_slices(blobs)
             .map(zstd.decode, num_parallel_calls=4)
             .batch(8)
             .map(lambda b: zstd.decode(zstd.encode(b, level=1)),
                  num_parallel_calls=4)
             .unbatch())
  for _ in range(2):  # Twice: fresh iterators, the same answer in order.
    assert [v.numpy() for v in dataset] == groups


def test_python_zstd_packages_compatible():
  packages = []
  for name in ('zstandard', 'cramjam'):
    try:
      packages.append(__import__(name))
    except ImportError:
      pass
  if not packages:
    pytest.skip('neither zstandard nor cramjam is installed')
  rng = np.random.default_rng(3)
  values = [b'', b'abc' * 1000, _smooth_frames(rng, 8).tobytes(),
            _random_bytes(rng, 3000)]
  ours = _encoded(values)
  for package in packages:
    if package.__name__ == 'zstandard':
      theirs = [package.ZstdCompressor(level=3).compress(v) for v in values]
      decompress = package.ZstdDecompressor().decompress
    else:
      theirs = [bytes(package.zstd.compress(v, level=3)) for v in values]
      decompress = lambda b, p=package: bytes(p.zstd.decompress(b))
    assert zstd.decode(tf.constant(theirs)).numpy().tolist() == values
    assert [decompress(blob) for blob in ours] == values


def test_every_flipped_byte_is_refused_or_harmless():
  original = _smooth_frames(np.random.default_rng(4), 2).tobytes()
  good = _encoded([b'first', original, b'last'])
  assert len(good[1]) > 40
  refused = 0
  for position in range(len(good[1])):
    damaged = bytearray(good[1])
    damaged[position] ^= 0xFF
    try:
      decoded = zstd.decode(tf.constant([good[0], bytes(damaged), good[2]]))
    except tf.errors.InvalidArgumentError as e:
      assert 'blobs[1] (flat index' in e.message, e.message
      refused += 1
      continue
    # Never silently wrong: a header flip zstd tolerates (a larger window,
    # say) must still give the original bytes.
    assert decoded.numpy().tolist() == [b'first', original, b'last'], position
  # Past the frame header (at most 18 bytes), every flip is refused.
  assert refused >= len(good[1]) - 18


def test_truncated_blobs_refused():
  blob = _encoded(_smooth_frames(np.random.default_rng(5), 2).tobytes())
  for length in list(range(1, 12)) + [len(blob) // 2, len(blob) - 1]:
    _refused([blob, blob[:length]], r'blobs\[1\] \(flat index')


def test_garbage_refused():
  rng = np.random.default_rng(6)
  for size in (1, 3, 4, 9, 100, 5000):
    _refused([_random_bytes(rng, size)], r'blobs\[0\] .*not a zstd frame')
  good = _encoded(b'good')
  for size in (10, 100, 5000):  # The magic number, then garbage.
    garbage = _MAGIC + _random_bytes(rng, size)
    _refused([[good, good], [garbage, good]], r'blobs\[2\] \(flat index')


def test_trailing_bytes_and_two_frames_refused():
  blob = _encoded(b'payload' * 100)
  _refused([blob + b'\0'], r'blobs\[0\] .*1 bytes after the zstd frame')
  _refused([blob, blob + blob], r'blobs\[1\] .*exactly one frame')


def test_skippable_and_unsized_frames_refused():
  skippable = b'\x50\x2a\x4d\x18' + (4).to_bytes(4, 'little') + b'data'
  _refused([skippable], r'blobs\[0\] .*skippable')
  # A single raw block without a recorded content size (descriptor 0x00,
  # window descriptor 0x00), as a streaming compressor writes it.
  unsized = _MAGIC + b'\x00\x00' + b'\x29\x00\x00' + b'hello'
  _refused([unsized], r'blobs\[0\] .*does not record its content size')


def test_empty_blob_refused_and_empty_data_round_trips():
  empty = _encoded(b'')
  _refused([empty, b''], r'blobs\[1\] \(flat index; 0 bytes\): empty string')
  assert empty and empty[:4] == _MAGIC
  assert zstd.decode(empty).numpy() == b''


def test_large_element():
  rng = np.random.default_rng(7)
  size = 16 << 20
  chunk = _smooth_frames(rng, 16).tobytes()  # ~110 kB of frames, repeated.
  data = (chunk * (size // len(chunk) + 1))[:size]
  blob = _encoded(data, level=1)
  assert len(blob) < size // 10
  assert zstd.decode(blob).numpy() == data
  _refused([blob], r'blobs\[0\] .*declared content size 16777216 bytes '
           r'exceeds max_size 16777215', max_size=size - 1)


def test_max_size_refused():
  blob = _encoded(_random_bytes(np.random.default_rng(8), 1000))
  assert len(zstd.decode(blob, max_size=1000).numpy()) == 1000
  _refused([blob], r'blobs\[0\] .*1000 bytes exceeds max_size 999',
           max_size=999)
  _refused([blob, blob], r'blobs\[0\] .*exceeds max_size 0', max_size=0)
  assert zstd.decode(_encoded(b''), max_size=0).numpy() == b''


def test_forged_content_size_refused_without_allocating():
  # A header declaring 1 TiB, then one empty last raw block.
  forged = (_MAGIC + b'\xe0' + (1 << 40).to_bytes(8, 'little') +
            b'\x01\x00\x00')
  _refused([forged], r'blobs\[0\] .*exceeds max_size')
  _refused([forged], r'blobs\[0\] .*more than a frame this size can hold',
           max_size=1 << 62)


def test_bad_arguments_refused():
  with pytest.raises(ValueError, match='max_size must be an int >= 0, got -1'):
    zstd.decode(b'', max_size=-1)
  with pytest.raises(ValueError, match='level must be an int, got 3.0'):
    zstd.encode(b'', level=3.0)
  for level in (23, 100, -131073):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf'level must be in \[-131072, 22\], got '
                             rf'{level}'):
      zstd.encode(b'data', level=level)

  @tf.function
  def encode_at_99(data):
    return zstd.encode(data, level=99)

  with pytest.raises(tf.errors.InvalidArgumentError, match='got 99'):
    encode_at_99(tf.constant([b'data']))


def test_no_compiler_says_what_to_install(tmp_path, monkeypatch):
  monkeypatch.setattr(zstd, '_module', None)
  monkeypatch.setattr(zstd, 'prebuilt_path',
                      lambda: str(tmp_path / zstd.LIBRARY_NAME))
  monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / 'cache'))
  monkeypatch.setenv('CXX', 'no-such-cxx')
  assert not zstd.available()
  with pytest.raises(zstd.ZstdOpMissingError) as raised:
    zstd.require()
  assert isinstance(raised.value, ImportError)
  message = str(raised.value)
  for part in ("no C++ compiler: 'no-such-cxx' is not on PATH",
               'apt-get install g++', 'make ops'):
    assert part in message, message
  with pytest.raises(zstd.ZstdOpMissingError):
    zstd.decode(b'')


_EXIT_SCRIPT = textwrap.dedent("""
    import os
    os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'
    import tensorflow as tf
    from smart_replay.ops import zstd

    size = {size}
    blobs = zstd.encode(
        tf.constant([str(i).encode() * size for i in range(8)]), level=1)
    dataset = (tf.data.Dataset.from_tensor_slices(blobs).repeat()
               .map(zstd.decode, num_parallel_calls=4).prefetch(4))
    iterator = iter(dataset)
    assert len(next(iterator).numpy()) == size
    print('took one', flush=True)
    # Exits with the iterator alive and the map still decoding.
    """)


@pytest.mark.parametrize('size', [1000, 16 << 20])
def test_process_exits_with_a_live_iterator(size):
  result = subprocess.run(
      [sys.executable, '-c', _EXIT_SCRIPT.format(size=size)],
      cwd=testing.ROOT, capture_output=True, text=True, timeout=120,
      check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'took one' in result.stdout


def test_compress_makes_the_ops_frames_without_tensorflow_dispatch():
  data = _smooth_frames(np.random.default_rng(5), 3).tobytes()
  blob = zstd.compress(data, level=9)
  assert blob[:4] == _MAGIC and blob[4] & 0x04  # With its checksum.
  assert blob == _encoded(data, level=9)
  assert zstd.compress(b'') == _encoded(b'')
  assert zstd.decode(tf.constant([blob])).numpy()[0] == data
  with pytest.raises(ValueError, match='level must be an int'):
    zstd.compress(data, level='9')
  with pytest.raises(ValueError, match='could not compress .* level 99'):
    zstd.compress(data, level=99)


def _group(rows, frames):
  """A group of cells, as smart_replay.layouts.frame_cells packs one."""
  counts = bytes([len(f) for f in frames])
  return (len(frames).to_bytes(2, 'little') + counts + rows.tobytes() +
          b''.join(f.tobytes() for f in frames))


def test_decode_cells_splits_groups_into_tensors():
  rng = np.random.default_rng(6)
  frame = (6, 5)
  groups, expected_rows, expected_frames, counts = [], [], [], []
  for _ in range(3 * 2):  # 3 windows of 2 groups of 4 cells.
    rows = rng.integers(0, 256, (4, 7), np.uint8)
    frames = [rng.integers(0, 256, (k,) + frame, np.uint8)
              for k in rng.integers(0, 4, 4)]
    groups.append(zstd.compress(_group(rows, frames)))
    expected_rows.append(rows)
    expected_frames += frames
    counts += [len(f) for f in frames]
  blobs = tf.constant(np.array(groups, object).reshape(3, 2))
  got_counts, rows, frames, offsets = zstd.decode_cells(
      blobs, cells=4, row_bytes=7, frame_bytes=30)
  assert got_counts.numpy().reshape(-1).tolist() == counts
  np.testing.assert_array_equal(rows.numpy().reshape(-1, 7),
                                np.concatenate(expected_rows))
  np.testing.assert_array_equal(frames.numpy(), np.concatenate(
      expected_frames).reshape(-1, 30))
  totals = np.array(counts).reshape(3, 8).sum(1)
  assert offsets.numpy().tolist() == [0, totals[0], totals[:2].sum()]
  # Static shapes inside a tf.function, and no windows at all.
  spec = tf.TensorSpec([None, 2], tf.string)
  traced = tf.function(lambda b: zstd.decode_cells(
      b, cells=4, row_bytes=7, frame_bytes=30)).get_concrete_function(spec)
  assert [o.shape.as_list() for o in traced.outputs] == [
      [None, 8], [None, 8, 7], [None, 30], [None]]
  empty = zstd.decode_cells(tf.zeros([0, 2], tf.string), cells=4,
                            row_bytes=7, frame_bytes=30)
  assert [t.shape.as_list() for t in empty] == [[0, 8], [0, 8, 7], [0, 30],
                                                [0]]


@pytest.mark.parametrize('damage, match', [
    (lambda g: g[:-3], r'blobs\[1\] \(flat index'),  # Truncated.
    (lambda g: g[:20] + bytes([g[20] ^ 1]) + g[21:], r'blobs\[1\]'),
    (lambda g: b'', r'blobs\[1\] .*empty string'),
    (lambda g: zstd.compress(b'\x04\x00' + b'\x00' * 40),  # 4 cells, 0 rows.
     r'blobs\[1\] .*not a group of 3 cells'),
    (lambda g: zstd.compress(b'\x02\x00\x01\x01\x00' + b'\x00' * 21 + b'x'
                             * 60), r'blobs\[1\] .*states 2 cells'),
    (lambda g: zstd.compress(b'\x03\x00\x01\x01\x01' + b'\x00' * 21 + b'x'
                             * 60), r'states 3 cells and 3 frames; expected'
     r' 3 cells and the 2 frames'),
])
def test_decode_cells_refuses_bad_groups_by_index(damage, match):
  rows = np.zeros((3, 7), np.uint8)
  frames = [np.full((1, 30), k, np.uint8) for k in range(3)]
  good = zstd.compress(_group(rows, frames[:2] + [frames[2][:0]]))
  blobs = tf.constant([[zstd.compress(_group(rows, frames)), damage(good)]])
  with pytest.raises(tf.errors.InvalidArgumentError, match=match):
    zstd.decode_cells(blobs, cells=3, row_bytes=7, frame_bytes=30)
