"""examples/sac_pendulum.py: a short run, then a resumed one."""

import smart_replay
from tests.examples import example_runner


def test_a_run_checkpoints_agent_and_buffer_and_resumes(tmp_path):
  root = tmp_path / 'run'
  args = [f'--root_dir={root}', '--initial_steps=300',
          '--checkpoint_interval=20', '--eval_episodes=1']
  first = example_runner.run('sac_pendulum', args + ['--num_iterations=30'],
                             cwd=str(tmp_path))
  assert first.returncode == 0, first.stderr[-3000:]
  assert 'Average return at train step 30' in first.stderr
  pair = smart_replay.newest_pair(str(root / 'buffer'), str(root / 'agent'))
  assert pair.train_step == 30
  second = example_runner.run('sac_pendulum', args + ['--num_iterations=50'],
                              cwd=str(tmp_path))
  assert second.returncode == 0, second.stderr[-3000:]
  assert 'Resumed at train step 30' in second.stderr
  assert 'Average return at train step 50' in second.stderr
  assert smart_replay.newest_pair(str(root / 'buffer'),
                                  str(root / 'agent')).train_step == 50


def test_flags(tmp_path):
  example_runner.check_flags('sac_pendulum', str(tmp_path))
