"""Building the zstd op (`smart_replay.ops.build`): keys, the per-user cache,
its lock and checks, and a pip-installed package that builds it by itself.

The slow test installs the package with pip into a folder and runs pixel
buffers from it in fresh processes, with a cache of their own: the first
process builds the op (one log line), processes started together build it
once, a later one reuses it.
"""

import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from smart_replay.ops import build
from smart_replay.ops import zstd
from smart_replay.ops import zstd_source


def _source_dir():
  """zstd's source in the real per-user cache (fetched once with pip)."""
  sources = os.path.join(build.cache_root(), 'sources')
  os.makedirs(sources, mode=0o700, exist_ok=True)
  return zstd_source.fetch(sources)


@pytest.mark.unit
def test_the_key_names_tensorflow_and_follows_the_source(tmp_path,
                                                         monkeypatch):
  key = build.library_key('2.15.1')
  assert key.startswith('tf2.15.1-') and len(key) == len('tf2.15.1-') + 16
  assert build.library_key('2.16.0') != key
  for changed_one in range(len(build.SOURCE_NAMES)):
    paths = build.source_paths()
    changed = tmp_path / build.SOURCE_NAMES[changed_one]
    changed.write_bytes(open(paths[changed_one], 'rb').read() + b'\n// x\n')
    paths[changed_one] = str(changed)
    with monkeypatch.context() as patched:
      patched.setattr(build, 'source_paths', lambda paths=paths: paths)
      assert build.library_key('2.15.1') != key


def test_a_missing_or_failing_compiler_is_named_and_leaves_nothing(tmp_path):
  output = tmp_path / 'out'
  output.mkdir()
  with pytest.raises(build.OpBuildError, match=re.escape(
      "no C++ compiler: 'no-such-cxx' is not on PATH; install a C++ compiler "
      '(Debian/Ubuntu: apt-get install g++)')):
    build.build(str(output / build.LIBRARY_NAME), zstd_dir=_source_dir(),
                compiler='no-such-cxx')
  fake = tmp_path / 'fake-cxx'
  fake.write_text('#!/bin/sh\necho "fatal error: broken" >&2\nexit 1\n')
  fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
  with pytest.raises(build.OpBuildError, match='failed .exit 1.:\nfatal '
                                               'error: broken'):
    build.build(str(output / build.LIBRARY_NAME), zstd_dir=_source_dir(),
                compiler=str(fake))
  with pytest.raises(build.OpBuildError, match="does not hold zstd's source"):
    build.build(str(output / build.LIBRARY_NAME), zstd_dir=str(tmp_path))
  assert os.listdir(output) == []  # No partial library, no scratch folder.


def test_unsafe_cache_folders_are_refused(tmp_path, monkeypatch):
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir(mode=0o700)
  cases = {'link': None, 'open': 0o777, 'group': 0o770}
  for name, mode in cases.items():
    root = tmp_path / name
    if mode is None:
      root.symlink_to(elsewhere)
    else:
      root.mkdir()
      root.chmod(mode)
    monkeypatch.setenv(build.CACHE_ENV, str(root))
    with pytest.raises(build.OpBuildError, match='refusing the op cache folder'
                                                 f' {root}: it') as raised:
      build.ensure_built()
    assert build.CACHE_ENV in str(raised.value)
  assert 'symbolic link' in _refusal(tmp_path / 'link', monkeypatch)
  assert 'mode 777' in _refusal(tmp_path / 'open', monkeypatch)
  if os.geteuid() == 0:  # A folder of another user.
    foreign = tmp_path / 'foreign'
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)
    assert 'belongs to uid 65534' in _refusal(foreign, monkeypatch)
  assert os.listdir(elsewhere) == []  # The link was not followed.


def _refusal(root, monkeypatch):
  monkeypatch.setenv(build.CACHE_ENV, str(root))
  with pytest.raises(build.OpBuildError) as raised:
    build.ensure_built()
  return str(raised.value)


def test_a_prebuilt_library_of_another_key_is_not_loaded(tmp_path,
                                                          monkeypatch):
  prebuilt = tmp_path / build.LIBRARY_NAME
  prebuilt.write_bytes(b'not a library')
  monkeypatch.setattr(zstd, 'prebuilt_path', lambda: str(prebuilt))
  monkeypatch.setattr(build, 'ensure_built', lambda: '/the/cached/one.so')
  assert zstd.library_path() == '/the/cached/one.so'  # No key file.
  (tmp_path / (build.LIBRARY_NAME + build.KEY_SUFFIX)).write_text('tf0-x\n')
  assert zstd.library_path() == '/the/cached/one.so'
  (tmp_path / (build.LIBRARY_NAME + build.KEY_SUFFIX)).write_text(
      build.library_key() + '\n')
  assert zstd.library_path() == str(prebuilt)


# A pixel buffer, from the package installed in argv[1]: frame-stacked spec
# (found by its shape), insert, sample, checkpoint, load.
_PIXEL_BUFFER = textwrap.dedent('''
    import os, sys
    from absl import logging
    import numpy as np
    import tensorflow as tf
    from tf_agents.specs import tensor_spec
    from tf_agents.trajectories import trajectory
    import smart_replay

    assert smart_replay.__file__.startswith(sys.argv[1]), smart_replay.__file__
    logging.set_verbosity(logging.INFO)
    spec = trajectory.Trajectory(
        step_type=tf.TensorSpec([], tf.int32, 'step_type'),
        observation=tensor_spec.BoundedTensorSpec([16, 16, 4], tf.uint8, 0,
                                                  255, 'observation'),
        action=tensor_spec.BoundedTensorSpec([], tf.int64, 0, 5, 'action'),
        policy_info=(), next_step_type=tf.TensorSpec([], tf.int32, 'step_type'),
        reward=tf.TensorSpec([], tf.float32, 'reward'),
        discount=tensor_spec.BoundedTensorSpec([], tf.float32, 0.0, 1.0,
                                               'discount'))
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (44, 16, 16), dtype=np.uint8)
    directory = os.path.join(sys.argv[2], 'buffer')
    manager = smart_replay.ReplayBufferManager(
        spec, capacity=1000, checkpoint_dir=directory, sequence_length=2)
    assert manager.buffer_config['layout']['frame_stack']['codec'] == 'zstd'
    _, observer = manager.create_replay_buffer()
    for t in range(40):
      first, last = t % 20 == 0, t % 20 == 19
      observer(trajectory.Trajectory(
          step_type=np.int32(0 if first else (2 if last else 1)),
          observation=np.moveaxis(frames[t:t + 4], 0, -1),
          action=np.int64(t % 6), policy_info=(),
          next_step_type=np.int32(2 if t % 20 == 18 else (0 if last else 1)),
          reward=np.float32(t), discount=np.float32(1.0)))
    observer.flush()
    sample, _ = next(iter(manager.get_dataset(batch_size=4, num_steps=2)))
    assert sample.observation.shape == (4, 2, 16, 16, 4)
    manager.checkpoint()
    manager.close()
    again = smart_replay.ReplayBufferManager.from_checkpoint(directory)
    again.load_replay_buffer()
    assert again.num_frames() > 30, again.num_frames()
    again.close()
    print('pixel buffer ok', flush=True)
    ''')


def _run_pixel_buffers(site, cache, work, count):
  """Starts `count` processes at once; returns their (stdout, stderr)."""
  env = dict(os.environ, PYTHONPATH=site, TF_CPP_MIN_LOG_LEVEL='3',
             **{build.CACHE_ENV: cache})
  env.pop('CXX', None)
  processes = []
  for i in range(count):
    folder = os.path.join(work, f'run{len(os.listdir(work))}-{i}')
    os.mkdir(folder)
    processes.append(subprocess.Popen(
        [sys.executable, '-c', _PIXEL_BUFFER, site, folder], env=env,
        cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True))
  results = [p.communicate(timeout=600) for p in processes]
  for process, (out, err) in zip(processes, results):
    assert process.returncode == 0 and 'pixel buffer ok' in out, err[-3000:]
  return results


def test_a_pip_installed_package_builds_the_op_once_and_reuses_it(tmp_path):
  # The package as pip installs it (no source tree, no prebuilt library).
  tree = tmp_path / 'tree'
  tree.mkdir()
  # The source tree (under Bazel, this file is a symlink in the runfiles).
  real_root = os.path.realpath(__file__)
  for _ in range(4):
    real_root = os.path.dirname(real_root)
  for part in ('setup.py', 'smart_replay', 'scripts', 'benchmarks',
               'configs'):
    source = os.path.join(real_root, part)
    if os.path.isdir(source):
      shutil.copytree(source, tree / part, ignore=shutil.ignore_patterns(
          '__pycache__', '*.so', '*.so.key', 'BUILD'))
    else:
      shutil.copy(source, tree / part)
  site = str(tmp_path / 'site')
  subprocess.run([sys.executable, '-m', 'pip', 'install', '--quiet',
                  '--no-deps', '--no-build-isolation', '--target', site,
                  str(tree)], check=True, timeout=300, capture_output=True)
  ops = os.path.join(site, 'smart_replay', 'ops')
  for name in build.SOURCE_NAMES:
    assert os.path.isfile(os.path.join(ops, name))
  assert not os.path.exists(os.path.join(ops, build.LIBRARY_NAME))
  # A cache of its own; zstd's source copied in (pip fetched it once).
  cache = tmp_path / 'cache'
  cache.mkdir(mode=0o700)
  (cache / 'sources').mkdir(mode=0o700)
  shutil.copytree(_source_dir(), cache / 'sources' / zstd_source.SOURCE_ID)
  work = str(tmp_path / 'work')
  os.mkdir(work)

  # Two processes started at the same moment: one builds, one waits.
  together = _run_pixel_buffers(site, str(cache), work, 2)
  logs = [err for _, err in together]
  assert sum('Building the zstd op' in log for log in logs) == 1, logs
  assert sum('Built the zstd op in' in log for log in logs) == 1, logs
  assert any('Waiting for another process that is building the zstd op'
             in log for log in logs), logs
  built = [n for n in os.listdir(cache / 'ops') if not n.endswith('.lock')]
  assert len(built) == 1 and built[0] == build.library_key()
  library = cache / 'ops' / built[0] / build.LIBRARY_NAME
  assert stat.S_IMODE(os.stat(cache / 'ops' / built[0]).st_mode) == 0o700
  mtime = os.stat(library).st_mtime_ns
  # A later process reuses it.
  (_, log), = _run_pixel_buffers(site, str(cache), work, 1)
  assert 'Building the zstd op' not in log and 'Waiting' not in log, log
  assert os.stat(library).st_mtime_ns == mtime
