"""Every console script, run as a user runs it: help, bad input, quiet logs.

Each binary is started as a subprocess from a directory outside the
repository. A progress bar is checked through a pseudo-terminal, the way a
user sees it.
"""

import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import time

import pytest

BIN = os.path.dirname(sys.executable)
# (console script, one of its own flags, a flag it must not list in --help)
SCRIPTS = [
    ('smart-replay-populate', '--buffer_name', '--test_srcdir'),
    ('smart-replay-demo', '--buffer_dir', '--test_srcdir'),
    ('smart-replay-train', '--starter_dir', '--test_srcdir'),
    ('smart-replay-serve', '--spec_file', '--test_srcdir'),
    ('smart-replay-inspect', '--export_rlds', '--test_srcdir'),
    ('smart-replay-import', '--spec_file', '--test_srcdir'),
    ('smart-replay-experiment', '--seeds', '--test_srcdir'),
]
# What TensorFlow and Reverb print at INFO level when nothing filters them.
NATIVE_INFO = re.compile(r'^(\d{4}-\d\d-\d\d [\d:.]+: [IE] |\[reverb/cc/)',
                         re.MULTILINE)


def _run(args, cwd, timeout=300):
  return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                        check=False, cwd=cwd)


def _check_help(result, own_flag, foreign_flag):
  assert result.returncode == 0, result.stderr[-2000:]
  assert own_flag in result.stdout and '--[no]quiet' in result.stdout
  assert foreign_flag not in result.stdout  # absl-test / TF flags
  assert 'Examples' in result.stdout or 'Usage' in result.stdout


@pytest.mark.parametrize('script, own_flag, foreign_flag', SCRIPTS)
def test_help_shows_the_programs_own_flags(tmp_path, script, own_flag,
                                           foreign_flag):
  _check_help(_run([os.path.join(BIN, script), '--help'], cwd=tmp_path),
              own_flag, foreign_flag)


def test_every_spelling_of_help(tmp_path):
  # Every script's help comes from the same entry point (binary.run): one
  # script stands for all (each start costs TensorFlow's import).
  script, own_flag, foreign_flag = SCRIPTS[0]
  _check_help(_run([os.path.join(BIN, script), '-h'], cwd=tmp_path),
              own_flag, foreign_flag)
  full = _run([os.path.join(BIN, script), '--helpfull'], cwd=tmp_path)
  assert full.returncode == 0 and own_flag in full.stdout


@pytest.mark.parametrize('script, own_flag, foreign_flag', SCRIPTS)
def test_a_bad_flag_is_one_line_and_exit_2(tmp_path, script, own_flag,
                                           foreign_flag):
  del own_flag, foreign_flag
  result = _run([os.path.join(BIN, script), '--no-such-flag=1'], cwd=tmp_path)
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert lines[0].startswith("error: Unknown command line flag 'no-such-flag'")
  assert lines[1:] == [f'Try `{script} --help`.'], result.stderr
  assert 'Traceback' not in result.stderr


# Every bad input reaches one handler (binary.run), which --verbose makes
# print the traceback: one case checks that (each run imports TensorFlow).
@pytest.mark.parametrize('gin_args, expected, check_verbose', [
    (['--gin_file=no_such.gin'], "--gin_file='no_such.gin': no such file",
     False),
    (['--gin_bindings=no_such_configurable.x = 1'],
     "No configurable matching 'no_such_configurable'", False),
    (['--gin_bindings=populate_starter_buffer.num_runs = ('],
     'bad gin config', True),
])
def test_bad_gin_is_one_line_and_exit_2(tmp_path, gin_args, expected,
                                        check_verbose):
  args = [os.path.join(BIN, 'smart-replay-populate'), '--buffer_name=b',
          f'--output_dir={tmp_path}', *gin_args]
  result = _run(args, cwd=tmp_path)
  assert result.returncode == 2, result.stderr[-2000:]
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 2 and lines[0].startswith('error: '), result.stderr
  assert expected in lines[0]
  if check_verbose:
    verbose = _run(args + ['--verbose'], cwd=tmp_path)
    assert verbose.returncode == 2 and 'Traceback' in verbose.stderr
    assert expected in verbose.stderr


def test_missing_required_flag_is_exit_2(tmp_path):
  result = _run([os.path.join(BIN, 'smart-replay-populate')], cwd=tmp_path)
  assert result.returncode == 2
  assert result.stderr.startswith('error: flag --buffer_name=None')


def test_populate_from_another_directory_is_quiet(tmp_path):
  """Hyphens or underscores, a shipped gin config by name, no native noise."""
  result = _run([os.path.join(BIN, 'smart-replay-populate'),
                 '--buffer-name=office', '--output-dir', str(tmp_path),
                 '--num_runs=2', '--steps-per-run=50',
                 '--gin_file=populate_thermal.gin'], cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  assert not NATIVE_INFO.search(result.stderr), result.stderr
  assert 'portpicker' not in result.stderr
  assert 'Populated' in result.stdout
  quiet = _run([os.path.join(BIN, 'smart-replay-populate'),
                '--buffer_name=office', f'--output_dir={tmp_path}',
                '--num_runs=2', '--steps_per_run=50', '--overwrite',
                '--quiet'], cwd=tmp_path)
  assert quiet.returncode == 0, quiet.stderr[-3000:]
  # --overwrite warns that it deleted the old buffer; nothing else is said.
  assert [line for line in quiet.stderr.splitlines()
          if 'overwrite=True' not in line] == [], quiet.stderr
  verbose = _run([os.path.join(BIN, 'smart-replay-populate'),
                  '--buffer_name=office', f'--output_dir={tmp_path}',
                  '--num_runs=1', '--steps_per_run=20', '--overwrite',
                  '--verbose'], cwd=tmp_path)
  assert verbose.returncode == 0
  assert '[reverb/cc/' in verbose.stderr  # --verbose keeps everything


def _read_pty(fd, deadline):
  out = b''
  while time.monotonic() < deadline:
    ready, _, _ = select.select([fd], [], [], 1.0)
    if not ready:
      continue
    try:
      data = os.read(fd, 65536)
    except OSError:  # the child closed the terminal
      break
    if not data:
      break
    out += data
  return out.decode('utf-8', 'replace')


def _render(line):
  """What a terminal shows of a line: each carriage return overwrites."""
  shown = []
  for piece in line.split('\r'):
    shown[:len(piece)] = piece
  return ''.join(shown).rstrip()


def test_progress_bar_is_not_broken_by_log_lines(tmp_path):
  """On a terminal, every log line sits on its own line above the bar."""
  args = [os.path.join(BIN, 'smart-replay-populate'), '--buffer_name=bar',
          f'--output_dir={tmp_path}', '--num_runs=3', '--steps_per_run=500']
  pid, fd = pty.fork()
  if pid == 0:  # the child: a 120-column terminal, like a user's
    import fcntl  # pylint: disable=g-import-not-at-top
    import termios  # pylint: disable=g-import-not-at-top
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack('HHHH', 30, 120, 0, 0))
    os.chdir(tmp_path)
    os.execv(args[0], args)
  output = _read_pty(fd, time.monotonic() + 300)
  _, status = os.waitpid(pid, 0)
  assert os.waitstatus_to_exitcode(status) == 0, output[-3000:]
  shown = [_render(line) for line in output.replace('\r\n', '\n').split('\n')]
  logs = [line for line in shown if re.search(r'[IWE]\d{4} \d', line)]
  assert len(logs) >= 3, output  # one 'Checkpointed' line per run
  # A 'Checkpointed' line per run, and once the note on Reverb's port.
  assert all('Checkpointed' in line or 'ALL network interfaces' in line
             for line in logs), logs
  # Each log line starts its own line: none is glued to a bar's text.
  assert all(re.match(r'^[IWE]\d{4} ', line) for line in logs), shown
  assert not NATIVE_INFO.search(output.replace('\r', '\n')), output
  bars = [line for line in shown if line.startswith('bar:')]
  # One bar is left on screen, complete: the others were overwritten.
  assert len(bars) == 1 and '| 1500/1500 [' in bars[0], shown


def test_wheel_ships_the_configs(tmp_path):
  """A wheel holds configs/*.gin; --gin_file=<name> finds them there."""
  # The source tree (under Bazel, this file is a symlink in the runfiles).
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.realpath(__file__))))
  wheel_dir, target = tmp_path / 'wheel', tmp_path / 'site'
  # A copy of the sources: pip builds in the source tree, whose build/ may
  # hold modules of an older checkout.
  source = tmp_path / 'source'
  shutil.copytree(root, source, ignore=shutil.ignore_patterns(
      '.venv', '.git', 'build', 'dist', '*.egg-info', 'bazel-*', '__pycache__',
      'demo_output', 'benchmark_results', 'starter_buffers', 'runs'))
  built = _run([sys.executable, '-m', 'pip', 'wheel', '--no-deps',
                '--no-build-isolation', '-q', '-w', str(wheel_dir),
                str(source)], cwd=tmp_path, timeout=600)
  assert built.returncode == 0, built.stderr[-3000:]
  wheel, = wheel_dir.glob('smart_replay-*.whl')
  import zipfile  # pylint: disable=g-import-not-at-top
  names = zipfile.ZipFile(wheel).namelist()
  assert 'smart_replay_configs/populate_thermal.gin' in names, names
  assert 'smart_replay/apps/binary.py' in names, names
  installed = _run([sys.executable, '-m', 'pip', 'install', '--no-deps', '-q',
                    '--target', str(target), str(wheel)], cwd=tmp_path)
  assert installed.returncode == 0, installed.stderr[-3000:]
  # The wheel's copy comes first on the path: not the repository's configs/.
  env = dict(os.environ, PYTHONPATH=str(target))
  where = subprocess.run(
      [sys.executable, '-c', 'from smart_replay.apps import configs; '
       "print(configs.resolve('populate_thermal.gin'))"],
      capture_output=True, text=True, cwd=tmp_path, env=env, check=False)
  assert where.stdout.strip().startswith(str(target)), where
  result = subprocess.run(
      [sys.executable, '-m', 'smart_replay_scripts.populate_starter_buffer',
       '--buffer_name=wheel', f'--output_dir={tmp_path / "out"}',
       '--num_runs=1', '--steps_per_run=20', '--quiet',
       '--gin_file=populate_thermal', '--gin_file=configs/default.gin'],
      capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
      check=False)
  assert result.returncode == 0, result.stderr[-3000:]
