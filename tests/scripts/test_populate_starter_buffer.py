"""End-to-end tests of the populate command, run as users run it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import smart_replay
from smart_replay import checkpoints

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


def test_console_script_with_the_original_dashed_flags(tmp_path):
  result = _run([CONSOLE_SCRIPT, '--buffer-name=office', '--steps-per-run=100',
                 '--num-runs', '3', f'--output_dir={tmp_path}', '--quiet'])
  assert result.returncode == 0, result.stderr[-3000:]
  buffer_dir = tmp_path / 'office_seq2_300steps'
  assert f'Populated {buffer_dir}: 300 steps' in result.stdout
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


@pytest.mark.parametrize('flag, message', [
    ('--env=mars', "unknown env 'mars'"),
    ('--capacity=-5', 'capacity'),
    ('--sequence_length=0', 'sequence_length'),
    ('--buffer_name=../escape', 'not a plain name'),
    ('--buffer_name=a/b', 'not a plain name'),
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


def test_sigterm_writes_a_final_checkpoint_and_exits_non_zero(tmp_path):
  process = _start_long_run(tmp_path)
  buffer_dir = tmp_path / 'long_seq2_144000steps'
  _wait_for_checkpoint(buffer_dir, 1, process)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 128 + signal.SIGTERM
  assert 'Interrupted: saved' in stderr and '--resume' in stderr
  saved = int(stderr.split('Interrupted: saved ')[1].split()[0])
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
  assert process.returncode == 128 + signal.SIGTERM
  assert 'send it again to quit at once' in stderr
  with _load(str(buffer_dir)) as manager:
    assert manager.loaded_manifest['extra']['populate']['steps'] >= 576


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
  assert record['env'] == 'gym:CartPole-v1'
  assert record['policy_class'] == 'CartPoleBalancePolicy'


def test_saved_policy_run(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_agents.agents.dqn import dqn_agent  # pylint: disable=g-import-not-at-top
  from tf_agents.networks import q_network  # pylint: disable=g-import-not-at-top
  from tf_agents.policies import policy_saver  # pylint: disable=g-import-not-at-top
  from tf_agents.specs import tensor_spec  # pylint: disable=g-import-not-at-top
  from smart_replay.envs import factory  # pylint: disable=g-import-not-at-top
  env = factory.make_environment('gym:CartPole-v1')
  agent = dqn_agent.DqnAgent(
      tensor_spec.from_spec(env.time_step_spec()),
      tensor_spec.from_spec(env.action_spec()),
      q_network=q_network.QNetwork(
          tensor_spec.from_spec(env.observation_spec()),
          tensor_spec.from_spec(env.action_spec()), fc_layer_params=(8,)),
      optimizer=tf.keras.optimizers.Adam())
  agent.initialize()
  policy_dir = tmp_path / 'policy'
  policy_saver.PolicySaver(agent.policy).save(str(policy_dir))
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
