"""`smart-replay-serve`: the binary's address line, exit codes and errors.

Serving real actors, SIGTERM and kill -9 are in
tests/smart_replay/test_remote.py.
"""

import json
import os
import signal
import socket
import subprocess
import sys

from smart_replay.spec import specs
from tests import testing
from tests.smart_replay.remote import remote_workers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable),
                              'smart-replay-serve')


def _serve(*args, timeout=120):
  return subprocess.run([CONSOLE_SCRIPT, *args], capture_output=True,
                        text=True, timeout=timeout, cwd=ROOT)


def test_bad_spec_file_and_bad_capacity_exit_2(tmp_path):
  missing = _serve(f'--spec_file={tmp_path}/none.pbtxt',
                   f'--checkpoint_dir={tmp_path}/buffer')
  assert missing.returncode == 2
  assert 'none.pbtxt' in missing.stderr and 'save_spec' in missing.stderr
  spec_file = str(tmp_path / 'spec.pbtxt')
  specs.save_spec(spec_file, testing.collect_data_spec(testing.make_env()))
  zero = _serve(f'--spec_file={spec_file}', f'--checkpoint_dir={tmp_path}/b',
                '--capacity=0')
  assert zero.returncode != 0
  assert '--capacity' in zero.stderr and '0' in zero.stderr


def test_serves_the_shipped_config_with_shape_flags(tmp_path):
  """Without --gin_file, serve.gin is used; --capacity and --sequence_length
  override it, like smart-replay-populate's flags."""
  spec_file = str(tmp_path / 'spec.pbtxt')
  specs.save_spec(spec_file, testing.collect_data_spec(testing.make_env()))
  process = subprocess.Popen(
      [CONSOLE_SCRIPT, f'--spec_file={spec_file}',
       f'--checkpoint_dir={tmp_path}/buffer',
       f'--port={remote_workers.free_port_pair()}', '--capacity=500',
       '--sequence_length=3'],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
  line = process.stdout.readline()
  assert line.startswith("Serving ['experience'] at "), line
  process.send_signal(signal.SIGINT)
  _, err = process.communicate(timeout=120)
  assert process.returncode == 0, err[-2000:]
  with open(os.path.join(tmp_path, 'buffer', 'checkpoints', 'ckpt-000001',
                         'manifest.json')) as f:
    manifest = json.load(f)
  assert (manifest['capacity'], manifest['sequence_length'],
          manifest['stride_length']) == (500, 3, 1)
  assert manifest['tables'][0]['remover'] == 'fifo'  # From serve.gin.


def test_serves_with_the_config_and_stops_on_sigint(tmp_path):
  spec_file = str(tmp_path / 'spec.pbtxt')
  specs.save_spec(spec_file, testing.collect_data_spec(testing.make_env()))
  process = subprocess.Popen(
      [CONSOLE_SCRIPT, f'--spec_file={spec_file}',
       f'--checkpoint_dir={tmp_path}/buffer',
       f'--port={remote_workers.free_port_pair()}',
       '--gin_file=configs/serve.gin'],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
  line = process.stdout.readline()
  assert line.startswith("Serving ['experience'] at "), line
  process.send_signal(signal.SIGINT)
  out, err = process.communicate(timeout=120)
  assert process.returncode == 0, err[-2000:]
  assert 'SECURITY' in err and 'ALL network interfaces' in err
  assert 'Stopped; final checkpoint:' in err
  assert os.path.isdir(os.path.join(tmp_path, 'buffer', 'checkpoints',
                                    'ckpt-000001'))
  del out


def test_a_taken_control_port_is_named_before_the_buffer_opens(tmp_path):
  """--port=P with P + 1 taken exits 2 naming --control_port; with
  --control_port=Q it serves."""
  spec_file = str(tmp_path / 'spec.pbtxt')
  specs.save_spec(spec_file, testing.collect_data_spec(testing.make_env()))
  port = remote_workers.free_port_pair()
  with socket.socket() as squatter:
    squatter.bind(('127.0.0.1', port + 1))
    squatter.listen()
    taken = _serve(f'--spec_file={spec_file}',
                   f'--checkpoint_dir={tmp_path}/buffer', f'--port={port}')
    assert taken.returncode == 2, taken.stderr[-2000:]
    assert (f"the control port, Reverb's port {port} + 1, {port + 1} is in "
            'use by another process') in taken.stderr
    assert '--control_port' in taken.stderr
    assert not os.path.exists(os.path.join(tmp_path, 'buffer', 'checkpoints'))
    control_port = remote_workers.free_port_pair()
    process = subprocess.Popen(
        [CONSOLE_SCRIPT, f'--spec_file={spec_file}',
         f'--checkpoint_dir={tmp_path}/buffer', f'--port={port}',
         f'--control_port={control_port}'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    line = process.stdout.readline()
    assert f'control at 127.0.0.1:{control_port})' in line, line
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
