"""examples/dqn_atari.py (TF-Agents' Atari DQN example on the manager), run
as a user runs it: a short training run on Pong, then a resumed one.

Learning is not expected in a few hundred train steps; the run must finish,
hold exactly the items its actors made, checkpoint buffer and agent at the
same train steps, and log finite losses.
"""

import glob
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import smart_replay
from smart_replay.storage import checkpoint_folders as checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
EXAMPLE = os.path.join(ROOT, 'examples/dqn_atari.py')
INITIAL_COLLECT_STEPS = 200
UPDATE_FREQUENCY = 4  # train_eval's default: collect steps per train step.
ITERATIONS = 100
CHECKPOINT_INTERVAL = 50
SUMMARY_INTERVAL = 25
# A short run: tiny evaluations (one 100-step episode) at the start and
# every 50 train steps, losses summarized every 25 train steps.
SHORT_RUN = [
    '--eval_interval=50',
    f'--gin_bindings=train_eval.initial_collect_steps={INITIAL_COLLECT_STEPS}',
    '--gin_bindings=train_eval.replay_capacity=10000',
    '--gin_bindings=train_eval.batch_size=32',
    f'--gin_bindings=train_eval.checkpoint_interval={CHECKPOINT_INTERVAL}',
    '--gin_bindings=train_eval.eval_episodes=1',
    '--gin_bindings=train_eval.max_episode_frames_eval=100',
    f'--gin_bindings=Learner.summary_interval={SUMMARY_INTERVAL}',
]


def _run(args, cwd, timeout=600):
  """Runs the example from `cwd` (outside the repository)."""
  return subprocess.run([sys.executable, EXAMPLE] + args, capture_output=True,
                        text=True, timeout=timeout, check=False, cwd=cwd)


def expected_items(collect_steps):
  """Items of sequence length 2 from `collect_steps` (non-boundary) steps.

  Each run of an Actor counts non-boundary steps; an episode end adds one
  boundary step and starts a new episode, so the two cancel. Two Actors
  (initial collect, then collect) each reset the environment: 2 episode
  starts, 1 item fewer each.
  """
  return collect_steps - 2


def newest_buffer_checkpoint(root_dir):
  return sorted(glob.glob(os.path.join(root_dir, 'replay_buffer',
                                       'checkpoints', 'ckpt-*')))[-1]


def losses(root_dir):
  """{train step: Losses/total_loss} from the Learner's summaries."""
  found = {}
  for path in glob.glob(os.path.join(root_dir, 'train', 'events.out.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == 'Losses/total_loss':
          found[event.step] = float(tf.make_ndarray(value.tensor))
  return found


@pytest.fixture(scope='module')
def short_run(tmp_path_factory):
  """A 100-iteration run on Pong; returns (root_dir, completed process)."""
  root_dir = str(tmp_path_factory.mktemp('dqn_pong') / 'run')
  result = _run([f'--root_dir={root_dir}', f'--num_iterations={ITERATIONS}']
                + SHORT_RUN, cwd=str(tmp_path_factory.mktemp('cwd')))
  return root_dir, result


def test_short_run_trains_and_checkpoints_buffer_and_agent(short_run):
  root_dir, result = short_run
  assert result.returncode == 0, result.stderr[-3000:]
  checkpoint = newest_buffer_checkpoint(root_dir)
  manifest = checkpoints.verify(checkpoint)  # Complete, digests match.
  assert manifest['extra'] == {'train_step': ITERATIONS}
  collected = INITIAL_COLLECT_STEPS + UPDATE_FREQUENCY * ITERATIONS
  assert manifest['counts']['tables']['experience']['items'] == (
      expected_items(collected))
  assert manifest['counts']['env_steps'] == collected
  # Found by its shape (the example passes no frame_stack), in zstd.
  assert manifest['layout']['frame_stack'] == {'field': 'observation',
                                               'axis': -1, 'codec': 'zstd'}
  # The Learner's agent checkpoints are taken at the buffer's train steps.
  agent = os.path.join(root_dir, 'train', 'checkpoints')
  assert tf.train.latest_checkpoint(agent).endswith(f'ckpt-{ITERATIONS}')
  assert os.path.isdir(os.path.join(root_dir, 'policies', 'greedy_policy'))
  assert glob.glob(os.path.join(root_dir, 'eval', 'events.out.*'))
  loss = losses(root_dir)
  assert sorted(loss) == list(range(0, ITERATIONS, SUMMARY_INTERVAL)), loss
  assert all(math.isfinite(v) for v in loss.values()), loss


def test_the_checkpoint_rebuilds_the_stacked_pong_frames(short_run, tmp_path):
  root_dir, result = short_run
  assert result.returncode == 0, result.stderr[-3000:]
  manager = smart_replay.ReplayBufferManager.from_checkpoint(
      newest_buffer_checkpoint(root_dir), checkpoint_dir=str(tmp_path))
  with manager:
    manager.load_replay_buffer(newest_buffer_checkpoint(root_dir))
    trajectory, _ = next(iter(manager.get_dataset(batch_size=32)))
  observation = trajectory.observation.numpy()
  assert observation.shape == (32, 2, 84, 84, 4)
  assert observation.dtype == np.uint8 and observation.max() > 0
  # Mid-episode, the second step's stack continues the first one's.
  mid = trajectory.step_type.numpy()[:, 1] == 1
  assert mid.any()
  np.testing.assert_array_equal(observation[mid, 1, ..., :3],
                                observation[mid, 0, ..., 1:])


def test_running_again_resumes_buffer_and_agent(short_run, tmp_path):
  first_dir, result = short_run
  assert result.returncode == 0, result.stderr[-3000:]
  root_dir = str(tmp_path / 'run')
  shutil.copytree(first_dir, root_dir)
  more = 50
  resumed = _run([f'--root_dir={root_dir}', f'--num_iterations={more}']
                 + SHORT_RUN, cwd=str(tmp_path))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'Resumed the replay buffer from' in resumed.stderr
  manifest = checkpoints.verify(newest_buffer_checkpoint(root_dir))
  # The agent resumed at its train step 100, the buffer with its items; the
  # initial collect runs again (as in TF-Agents' example).
  assert manifest['extra'] == {'train_step': ITERATIONS + more}
  assert manifest['counts']['tables']['experience']['items'] == (
      expected_items(INITIAL_COLLECT_STEPS + UPDATE_FREQUENCY * ITERATIONS) +
      expected_items(INITIAL_COLLECT_STEPS + UPDATE_FREQUENCY * more))
  assert tf.train.latest_checkpoint(
      os.path.join(root_dir, 'train', 'checkpoints')).endswith(
          f'ckpt-{ITERATIONS + more}')


def test_help_works_from_any_directory(tmp_path):
  result = _run(['--help'], cwd=str(tmp_path), timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'DQN' in result.stdout and '--num_iterations' in result.stdout
  assert '--root_dir' in result.stdout


@pytest.mark.parametrize('args, message', [
    (['--num_iteration=3'], "Unknown command line flag 'num_iteration'"),
    (['--num_iterations=x'], 'flag --num_iterations=x'),
    ([], 'Flag --root_dir must have a value'),
])
def test_bad_flags_exit_2(tmp_path, args, message, monkeypatch):
  monkeypatch.delenv('TEST_UNDECLARED_OUTPUTS_DIR', raising=False)
  root = [] if not args else [f'--root_dir={tmp_path / "run"}']
  result = _run(root + args, cwd=str(tmp_path), timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  assert message in result.stderr
  assert not (tmp_path / 'run').exists()
