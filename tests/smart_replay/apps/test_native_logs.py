"""What the binaries' native-log filter keeps, and when it stays out."""

import os
import subprocess
import sys

import pytest

from smart_replay.apps import native_logs


@pytest.mark.unit
@pytest.mark.parametrize('line, kept', [
    ('[reverb/cc/platform/default/server.cc:71] Started replay server on '
     'port 40809', False),
    ('[reverb/cc/reverb_service_impl.cc:168] Stored checkpoint to /x', False),
    ('[reverb/cc/platform/tfrecord_checkpointer.cc:447] Still reading '
     'compressed trajectory data. 1 records have been read so far.', False),
    ('[reverb/cc/table.cc:10] Failed to insert item: deadline exceeded', True),
    ('[reverb/cc/client.cc:9] Check failed: x == y', True),
    ('2026-11-24 22:22:50.971709: E external/local_xla/xla/stream_executor/'
     'cuda/cuda_fft.cc:607] Unable to register cuFFT factory: ...', False),
    ('2026-11-24 22:22:50.971709: E tensorflow/core/framework/op.cc:1] '
     'Out of memory', True),
    ('Segmentation fault', True),
])
def test_keeps(line, kept):
  assert native_logs.keeps(line) == kept


@pytest.mark.unit
@pytest.mark.parametrize('argv, wanted', [
    (['prog'], False),
    (['prog', '--verbose'], True),
    (['prog', '-v'], True),
    (['prog', '-v', '0'], False),
    (['prog', '-v', '1'], True),
    (['prog', '--verbosity=2'], True),
    (['prog', '--verbosity=0'], False),
    (['prog', '--verbosity', '1'], True),
    (['prog', '--', '--verbose'], False),
])
def test_wants_native_logs(argv, wanted):
  assert native_logs.wants_native_logs(argv) == wanted


def test_filter_process_drops_noise_and_survives_an_abort():
  """C++-level lines go through the filter; the last one after os.abort too."""
  program = (
      'import os, sys\n'
      'from smart_replay.apps import native_logs\n'
      'assert native_logs.install(sys.argv)\n'
      'os.write(2, b"[reverb/cc/server.cc:1] Started replay server\\n")\n'
      'print("from python", file=sys.stderr, flush=True)\n'
      'os.write(2, b"[reverb/cc/x.cc:2] Check failed: fatal\\n")\n'
      'os.abort()\n')
  result = subprocess.run([sys.executable, '-c', program], capture_output=True,
                          text=True, timeout=120, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL=''))
  assert result.returncode != 0
  assert 'Started replay server' not in result.stderr
  assert 'from python' in result.stderr
  assert 'Check failed: fatal' in result.stderr
