"""`smart-replay-import`: a plain Reverb buffer becomes a smart_replay buffer."""

import os
import subprocess
import sys

from smart_replay.spec import specs
from tests.smart_replay.tools import test_takeover

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable),
                              'smart-replay-import')


def _import(tmp_path, *args):
  return subprocess.run([CONSOLE_SCRIPT, *args], capture_output=True,
                        text=True, timeout=300, cwd=str(tmp_path))


def test_imports_and_refuses_with_the_flag_named(tmp_path, data_spec):
  _, stored = test_takeover._original_buffer(tmp_path / 'original', data_spec,
                                             steps=60)
  specs.save_spec(str(tmp_path / 'spec.json'), data_spec)
  args = ['--source=original', '--checkpoint_dir=ours',
          '--spec_file=spec.json']
  done = _import(tmp_path, *args)
  assert done.returncode == 0, done.stderr
  assert f'Imported {len(stored)} items' in done.stdout
  assert os.path.isdir(tmp_path / 'ours' / 'checkpoints' / 'ckpt-000001')
  again = _import(tmp_path, *args)
  assert again.returncode == 2
  assert 'pass --overwrite to delete it' in again.stderr
  missing = _import(tmp_path, '--source=nothing', '--checkpoint_dir=x',
                    '--spec_file=spec.json')
  assert missing.returncode == 2
  assert 'no complete Reverb checkpoint at' in missing.stderr
  typo = _import(tmp_path, '--sourse=original')
  assert typo.returncode == 2 and 'Did you mean: source' in typo.stderr
