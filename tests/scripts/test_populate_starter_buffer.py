"""End-to-end tests of the populate command, run as users run it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import smart_replay
from smart_replay.storage import checkpoint_folders as checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable),
                              'smart-replay-populate')
MODULE = [sys.executable, '-m', 'smart_replay_scripts.populate_starter_buffer']


def _run(args, timeout=300):
  return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                        check=False, cwd=ROOT)


def _load(source):
  """Loads a buffer directory or one checkpoint folder, in place."""
  manager = smart_replay.ReplayBufferManager.from_checkpoint(source)
  manager.load_replay_buffer(source)
  return manager


def test_console_script_with_hyphenated_flags(tmp_path):
  result = _run([CONSOLE_SCRIPT, '--buffer-name=office', '--steps-per-run=100',
                 '--num-runs', '3', f'--output_dir={tmp_path}', '--quiet'])
  assert result.returncode == 0, result.stderr[-3000:]
  buffer_dir = tmp_path / 'office_seq2_300steps'
  assert f'Populated {buffer_dir}: 300 env steps' in result.stdout
  record = json.loads((buffer_dir / 'provenance.json').read_text())
  assert record['steps_collected'] == 300 and record['runs_completed'] == 3
  with _load(str(buffer_dir)) as manager:
    assert manager.num_frames() == record['items'] == 299


def test_python_dash_m_and_existing_buffer_refused(tmp_path):
  args = MODULE + ['--buffer_name=b', '--steps_per_run=50', '--num_runs=1',
                   f'--output_dir={tmp_path}', '--quiet']
  assert _run(args).returncode == 0
  again = _run(args)
  assert again.returncode == 2
  assert 'already exists' in again.stderr and '--resume' in again.stderr
  assert _run(args + ['--overwrite']).returncode == 0


# Each case past the flags' own checks costs a process that imports
# TensorFlow: one name of each kind (tests/smart_replay/apps/test_populate.py
# checks the other bad names in process).
@pytest.mark.parametrize('flag, message', [
    ('--env=mars', "unknown env 'mars'"),
    ('--capacity=-5', 'capacity'),
    ('--sequence_length=0', 'sequence_length'),
    ('--buffer_name=../escape', 'not a plain name'),
])
def test_bad_flags_exit_non_zero_with_a_clear_message(tmp_path, flag, message):
  args = [CONSOLE_SCRIPT, '--buffer_name=ok', f'--output_dir={tmp_path}',
          '--num_runs=1', '--steps_per_run=10', '--quiet', flag]
  result = _run(args)
  assert result.returncode != 0
  assert message in result.stderr
  assert not os.listdir(tmp_path)


def test_missing_buffer_name_is_an_error(tmp_path):
  result = _run([CONSOLE_SCRIPT, f'--output_dir={tmp_path}'])
  assert result.returncode != 0 and 'buffer_name' in result.stderr


def _wait_for_checkpoint(buffer_dir, number, process, timeout=120):
  deadline = time.monotonic() + timeout
  target = buffer_dir / 'checkpoints' / checkpoints.checkpoint_name(number)
  while not target.exists():
    assert process.poll() is None, process.communicate()[1][-3000:]
    assert time.monotonic() < deadline, f'{target} never appeared'
    time.sleep(0.05)


def _start_long_run(tmp_path):
  return subprocess.Popen(
      [CONSOLE_SCRIPT, '--buffer_name=long', '--steps_per_run=288',
       '--num_runs=500', f'--output_dir={tmp_path}', '--quiet'],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def test_a_signal_writes_a_final_checkpoint_and_exits_non_zero(tmp_path):
  # SIGTERM here; SIGINT's exit code, message and final checkpoint in
  # test_resume_through_the_command_reaches_the_total (one handler).
  signum = signal.SIGTERM
  process = _start_long_run(tmp_path)
  buffer_dir = tmp_path / 'long_seq2_144000steps'
  _wait_for_checkpoint(buffer_dir, 1, process)
  process.send_signal(signum)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 128 + signum
  assert 'Interrupted: collected' in stderr and '--resume' in stderr
  saved = int(stderr.split('Interrupted: collected ')[1].split()[0].replace(
      ',', ''))
  with _load(str(buffer_dir)) as manager:
    assert manager.loaded_manifest['extra']['populate']['steps'] == saved
    record = json.loads((buffer_dir / 'provenance.json').read_text())
    assert record['interrupted'] and record['steps_collected'] == saved
    assert manager.num_frames() == record['items']


def test_a_second_signal_quits_at_once_and_the_buffer_still_loads(tmp_path):
  process = _start_long_run(tmp_path)
  buffer_dir = tmp_path / 'long_seq2_144000steps'
  _wait_for_checkpoint(buffer_dir, 2, process)
  process.send_signal(signal.SIGTERM)
  time.sleep(0.05)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=120)
  # The second signal lands while collecting or saving (it quits at once), or
  # after the final checkpoint (ignored): the exit code and the buffer are
  # right either way. StopRequest's own test covers the quit itself.
  assert process.returncode == 128 + signal.SIGTERM
  assert ('Quit without a final checkpoint' in stderr or
          'Interrupted: collected' in stderr)
  with _load(str(buffer_dir)) as manager:
    assert manager.loaded_manifest['extra']['populate']['steps'] >= 576


def test_resume_through_the_command_reaches_the_total(tmp_path):
  args = [CONSOLE_SCRIPT, '--buffer_name=r', '--steps_per_run=288',
          '--num_runs=4', f'--output_dir={tmp_path}', '--quiet']
  process = subprocess.Popen(args, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT)
  buffer_dir = tmp_path / 'r_seq2_1152steps'
  _wait_for_checkpoint(buffer_dir, 1, process)
  process.send_signal(signal.SIGINT)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 128 + signal.SIGINT
  assert 'Interrupted: collected' in stderr and '--resume' in stderr
  saved = int(stderr.split('Interrupted: collected ')[1].split()[0].replace(
      ',', ''))
  with _load(str(buffer_dir)) as manager:  # Its final checkpoint.
    assert manager.loaded_manifest['extra']['populate']['steps'] == saved
  resumed = _run(args + ['--resume'])
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f'Populated {buffer_dir}: 1,152 env steps' in resumed.stdout
  record = json.loads((buffer_dir / 'provenance.json').read_text())
  assert record['steps_collected'] == 1152 and record['complete']
  assert len(record['sessions']) == 2


def test_unusable_output_dir_is_reported(tmp_path):
  (tmp_path / 'a_file').write_text('x')
  result = _run([CONSOLE_SCRIPT, '--buffer_name=x', '--num_runs=1',
                 '--steps_per_run=10', f'--output_dir={tmp_path}/a_file',
                 '--quiet'])
  assert result.returncode == 2
  line = [l for l in result.stderr.splitlines() if l.startswith('error:')][0]
  assert 'Not a directory' in line and f'{tmp_path}/a_file' in line
  assert 'Traceback' not in result.stderr


def test_kill_9_loses_at_most_the_last_run(tmp_path):
  process = _start_long_run(tmp_path)
  buffer_dir = tmp_path / 'long_seq2_144000steps'
  _wait_for_checkpoint(buffer_dir, 3, process)
  process.kill()
  process.communicate(timeout=60)
  newest, previous = checkpoints.find_checkpoints(str(buffer_dir))[:2]
  steps = []
  for path in (newest, previous):  # Both kept checkpoints load.
    with _load(path) as manager:
      steps.append(manager.loaded_manifest['extra']['populate']['steps'])
      assert manager.num_frames() > 0
  assert steps[0] - steps[1] == 288 and steps[1] >= 576 and steps[0] % 288 == 0


def test_gin_files_for_each_environment(tmp_path):
  thermal = _run([CONSOLE_SCRIPT, '--buffer_name=t', f'--output_dir={tmp_path}',
                  '--gin_file=configs/populate_thermal.gin', '--num_runs=1',
                  '--quiet'])
  assert thermal.returncode == 0, thermal.stderr[-3000:]
  record = json.loads(
      (tmp_path / 't_seq2_288steps' / 'provenance.json').read_text())
  assert record['policy'] == 'schedule' and record['capacity'] == 50000
  assert 'ThermalZoneEnv.capacitance = 1.0' in record['gin_config']

  cartpole = _run([CONSOLE_SCRIPT, '--buffer_name=c', f'--output_dir={tmp_path}',
                   '--gin_file=configs/populate_cartpole.gin', '--num_runs=1',
                   '--steps_per_run=100', '--quiet'])
  assert cartpole.returncode == 0, cartpole.stderr[-3000:]
  record = json.loads(
      (tmp_path / 'c_seq2_100steps' / 'provenance.json').read_text())
  assert record['env'] == 'gymnasium:CartPole-v1'
  assert record['policy_class'] == 'CartPoleBalancePolicy'


def test_saved_policy_run(tmp_path):
  # A saved policy that emits policy_info: its own specs must reach the buffer.
  from tf_agents.policies import policy_saver  # pylint: disable=g-import-not-at-top
  from tf_agents.policies import random_tf_policy  # pylint: disable=g-import-not-at-top
  from tf_agents.specs import tensor_spec  # pylint: disable=g-import-not-at-top
  from smart_replay.apps.envs import factory  # pylint: disable=g-import-not-at-top
  env = factory.make_environment('gym:CartPole-v1')
  policy = random_tf_policy.RandomTFPolicy(
      tensor_spec.from_spec(env.time_step_spec()),
      tensor_spec.from_spec(env.action_spec()), emit_log_probability=True)
  policy_dir = tmp_path / 'policy'
  policy_saver.PolicySaver(policy).save(str(policy_dir))
  result = _run([CONSOLE_SCRIPT, '--buffer_name=s', f'--output_dir={tmp_path}',
                 '--gin_file=configs/populate_saved_policy.gin',
                 f"--gin_bindings=SAVED_POLICY_DIR = '{policy_dir}'",
                 '--num_runs=2', '--steps_per_run=60', '--quiet'])
  assert result.returncode == 0, result.stderr[-3000:]
  record = json.loads(
      (tmp_path / 's_seq2_120steps' / 'provenance.json').read_text())
  assert record['policy'] == f'saved:{policy_dir}'
  assert record['policy_class'] == 'SavedModelPyTFEagerPolicy'
  assert record['steps_collected'] == 120
  assert 'policy_info/log_probability' in [l['path'] for l in
                                           record['data_spec']]
