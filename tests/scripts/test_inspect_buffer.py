"""`smart-replay-inspect`: text, JSON, plot, export/import, and clear errors."""

import json
import os
import subprocess
import sys

import smart_replay
from tests import testing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable),
                              'smart-replay-inspect')


def _inspect(*args):
  return subprocess.run([CONSOLE_SCRIPT, *args], capture_output=True,
                        text=True, timeout=300, cwd=ROOT)


def _buffer(tmp_path, data_spec):
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec, capacity=400, checkpoint_dir=str(tmp_path / 'b'))
  with manager:
    _, observer = manager.create_replay_buffer()
    testing.run_actor(observer, 90)
    path = manager.checkpoint()
    items = manager.num_frames()
  return str(tmp_path / 'b'), path, items


def test_json_plot_export_and_import(tmp_path, data_spec):
  source, path, items = _buffer(tmp_path, data_spec)
  done = _inspect(source, '--json', f'--plot={tmp_path}/p.png',
                  f'--export_rlds={tmp_path}/rlds',
                  f'--export_npz={tmp_path}/t.npz')
  assert done.returncode == 0, done.stderr[-2000:]
  description = json.loads(done.stdout)
  assert description['checkpoint'] == path
  assert description['tables']['experience']['size'] == items
  assert os.path.getsize(tmp_path / 'p.png') > 1000
  assert f'Exported {items} items' in done.stderr
  again = _inspect(f'{tmp_path}/rlds', f'--import_to={tmp_path}/again')
  assert again.returncode == 0, again.stderr[-2000:]
  text = _inspect(f'{tmp_path}/again')
  assert f'{items:,}/400 items' in text.stdout


def test_missing_and_corrupt_exit_2_with_the_reason(tmp_path, data_spec):
  missing = _inspect(str(tmp_path / 'nope'))
  assert missing.returncode == 2
  assert 'error:' in missing.stderr and 'nope' in missing.stderr
  source, path, _ = _buffer(tmp_path, data_spec)
  with open(os.path.join(path, 'items.tfrecord'), 'ab') as f:
    f.write(b'junk')
  corrupt = _inspect(source)
  assert corrupt.returncode == 2
  assert 'damaged' in corrupt.stderr and 'items.tfrecord' in corrupt.stderr
  unreachable = _inspect('localhost:1', '--timeout_s=1')
  assert unreachable.returncode == 2 and 'localhost:1' in unreachable.stderr
