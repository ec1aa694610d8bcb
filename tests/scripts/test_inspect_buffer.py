"""`smart-replay-inspect`: text, JSON, plot, export/import, and clear errors."""

import json
import os
import signal
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


def test_a_signal_stops_inspect_and_promises_no_checkpoint(tmp_path,
                                                           data_spec):
  source, _, _ = _buffer(tmp_path, data_spec)
  process = subprocess.Popen(
      [CONSOLE_SCRIPT, source, f'--plot={tmp_path}/p.png',
       f'--export_npz={tmp_path}/t.npz', f'--export_rlds={tmp_path}/rlds'],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
  # The description comes first (flushed): the work, with its signal
  # handlers, is under way; the plot and both exports follow.
  described = process.stdout.readline()
  assert described, process.communicate()[1][-3000:]
  process.send_signal(signal.SIGINT)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 128 + signal.SIGINT, stderr[-3000:]
  said = [line for line in stderr.splitlines()
          if f'Signal {int(signal.SIGINT)}:' in line]
  assert len(said) == 1, stderr[-3000:]
  assert 'stopping' in said[0] and 'checkpoint' not in said[0].lower()
  assert 'Interrupted.' in stderr
  # Stopped before the exports: nothing more was written.
  assert not os.path.exists(tmp_path / 't.npz')
  assert not os.path.exists(tmp_path / 'rlds')
