"""End-to-end tests of smart-replay-train, run as users run it."""

import json
import os
import subprocess
import sys
import time

import pytest
from tf_agents.policies import random_py_policy

from smart_replay.apps import populate
from smart_replay.apps import training
from smart_replay.apps.envs import factory
from smart_replay.integrations import paired as paired_checkpoint
from smart_replay.storage import checkpoint_folders as checkpoints
from tests import testing

BIN = os.path.dirname(sys.executable)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
TRAIN = os.path.join(BIN, 'smart-replay-train')


@pytest.fixture(scope='module')
def starter(tmp_path_factory):
  return populate.populate_starter_buffer(
      buffer_name='cartpole', output_dir=str(tmp_path_factory.mktemp('s')),
      env='gym:CartPole-v1', policy='random', steps_per_run=500, num_runs=4,
      show_progress=False).buffer_dir


def test_dqn_on_cartpole_learns(starter, tmp_path):
  before = testing.dir_digest(starter)
  result = subprocess.run(
      [TRAIN, f'--starter_dir={starter}', f'--run_dir={tmp_path / "run"}',
       '--gin_file=configs/train_dqn_cartpole.gin', '--num_train_steps=3000',
       '--eval_episodes=20', '--seed=0'],
      capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-3000:]
  record = json.loads((tmp_path / 'run' / 'result.json').read_text())
  env = factory.make_environment('gym:CartPole-v1', seed=1)  # The eval seed.
  random_return = training.greedy_return(
      random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(),
                                      seed=0), env, 20)
  assert record['train_step'] == 3000
  assert record['greedy_return'] > 3 * random_return, (record, random_return)
  assert testing.dir_digest(starter) == before  # The starter is only read.


def test_kill_9_then_resume_continues_from_the_recorded_step(starter,
                                                             tmp_path):
  run_dir = tmp_path / 'run'
  process = subprocess.Popen(
      [TRAIN, f'--starter_dir={starter}', f'--run_dir={run_dir}',
       '--num_train_steps=100000', '--checkpoint_every=100',
       '--collect_steps_per_iteration=50', '--train_steps_per_iteration=50',
       '--eval_episodes=0'],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
  deadline = time.monotonic() + 300
  while not any(p.train_step >= 300 for p in paired_checkpoint.find_pairs(
      str(run_dir / 'buffer'), str(run_dir / 'agent'))):
    assert process.poll() is None, process.communicate()[1][-3000:]
    assert time.monotonic() < deadline
    time.sleep(0.1)
  process.kill()
  process.communicate(timeout=60)
  pair = paired_checkpoint.newest_pair(str(run_dir / 'buffer'),
                                       str(run_dir / 'agent'))
  saved_items = checkpoints.verify(pair.buffer_checkpoint)['counts'][
      'tables']['experience']['items']
  target = pair.train_step + 200
  resumed = subprocess.run(
      [TRAIN, f'--starter_dir={starter}', f'--run_dir={run_dir}', '--resume',
       f'--num_train_steps={target}', '--checkpoint_every=100',
       '--collect_steps_per_iteration=50', '--train_steps_per_iteration=50',
       '--eval_episodes=0'],
      capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  record = json.loads((run_dir / 'result.json').read_text())
  assert record['resumed_from'] == pair.train_step
  assert record['train_step'] == target
  # The journal brings back what the killed run stored after its last save.
  assert record['items_at_start'] == saved_items + record['items_replayed']
  assert record['items'] == saved_items + record['items_collected']


def test_missing_starter_exits_2(tmp_path):
  result = subprocess.run(
      [TRAIN, f'--starter_dir={tmp_path / "none"}', f'--run_dir={tmp_path}/r'],
      capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
  assert result.returncode == 2 and 'no checkpoint to load' in result.stderr


def test_an_old_gin_binding_exits_2_naming_it(tmp_path):
  """train_from_starter is no longer gin-configurable: its groups are."""
  result = subprocess.run(
      [TRAIN, f'--starter_dir={tmp_path / "none"}', f'--run_dir={tmp_path}/r',
       '--gin_bindings=train_from_starter.num_train_steps = 3'],
      capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "No configurable matching 'train_from_starter'" in result.stderr
