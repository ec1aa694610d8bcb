"""A real second Unix user for tests that replay another local user's attacks.

`require()` returns the user `smart_replay_other` (made once, idempotently,
with `useradd --system --no-create-home`) when the tests run as root, and
skips the test (`pytest.skip`, with the reason) otherwise, or when `useradd`
or `runuser`/`setpriv` is missing::

    from tests import other_user

    def test_other_user_cannot_read_the_token(tmp_path):
      other = other_user.require()
      done = other.run_python('open("/some/file").read()', timeout_s=60)
      assert 'PermissionError' in done.stderr

Code runs as that user, with its uid, gid and its own groups only, through
`runuser -u NAME --` (else `setpriv`), in a clean environment: `PATH`,
`HOME` (a temporary folder that user owns), `PYTHONPATH` (the project's
source folder, so `import smart_replay` works; under Bazel the checkout the
runfiles link to) and `LANG`. The interpreter is
`sys.executable` when that user can run it; when it cannot (it lives in a
folder only root may enter, e.g. pyenv under `/root`), the system's Python of
the same version, with this environment's site-packages on `PYTHONPATH` too.
"""

import atexit
import dataclasses
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Any, Dict, List, Optional

import pytest

NAME = 'smart_replay_other'
# The project's source folder, links resolved: `import smart_replay` works
# from here. Under Bazel this file is a link in a runfiles tree below root's
# cache (`/root/.cache/bazel`, which no other user may enter); its target is
# the checkout's own file.
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
_USERADD_ATTEMPTS = 5
_PROBE_TIMEOUT_S = 120.0
_user: Optional['OtherUser'] = None  # Made once per process.


@dataclasses.dataclass(frozen=True)
class OtherUser:
  """Another Unix user, to run code as (see the module docstring).

  Attributes:
    name: its user name.
    uid: its user id.
    gid: its primary group id.
    home: a temporary folder it owns (`HOME` of the code it runs).
    python: the interpreter it runs.
    pythonpath: `PYTHONPATH` of the code it runs.
    switch: the command prefix that becomes the user (`runuser ... --`).
  """
  name: str
  uid: int
  gid: int
  home: str
  python: str
  pythonpath: str
  switch: List[str]

  def run_python(self, code: str, *, timeout_s: float,
                 cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """Runs `python -c code` as this user and waits for it.

    Args:
      code: the Python source.
      timeout_s: the most seconds to wait (`subprocess.TimeoutExpired`).
      cwd: the working folder (this user must be able to enter it); default
        `home`.

    Returns:
      The finished process; `stdout` and `stderr` are text.
    """
    if timeout_s <= 0:
      raise ValueError(f'timeout_s must be positive, got {timeout_s!r}.')
    return subprocess.run(self._command(code), capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd or self.home,
                          check=False)

  def popen_python(self, code: str, **popen_kwargs: Any) -> subprocess.Popen:
    """Starts `python -c code` as this user, without waiting.

    Args:
      code: the Python source.
      **popen_kwargs: passed to `subprocess.Popen` (e.g. `stdout=PIPE`,
        `text=True`); `env` adds variables to the child's clean environment;
        `cwd` defaults to `home`.

    Returns:
      The started process (the caller waits for it, or kills it).
    """
    extra_env = popen_kwargs.pop('env', None)
    popen_kwargs.setdefault('cwd', self.home)
    return subprocess.Popen(self._command(code, extra_env), **popen_kwargs)

  def make_dir(self, path: str) -> str:
    """Makes a folder owned by this user (mode 0755), e.g. to plant files in.

    It is made by root and handed over, so it can be anywhere; to show that
    the user can make it alone, make it with `run_python` instead.

    Args:
      path: the folder; its parent must exist.

    Returns:
      `path`.
    """
    os.mkdir(path)
    os.chown(path, self.uid, self.gid)
    os.chmod(path, 0o755)
    return path

  def _command(self, code: str,
               extra_env: Optional[Dict[str, str]] = None) -> List[str]:
    env = {'PATH': _PATH, 'HOME': self.home, 'PYTHONPATH': self.pythonpath,
           'LANG': 'C.UTF-8', 'TF_CPP_MIN_LOG_LEVEL': '2',
           'PYTHONDONTWRITEBYTECODE': '1', **(extra_env or {})}
    return [*self.switch, '/usr/bin/env', '-i',
            *(f'{k}={v}' for k, v in env.items()), self.python, '-c', code]


def require() -> OtherUser:
  """The other user, made once; skips the test where that is impossible.

  Returns:
    The user `smart_replay_other`.

  Raises:
    pytest.skip.Exception: unless running as root with `useradd` and
      `runuser` (or `setpriv`), or if no interpreter works for that user.
  """
  global _user
  if _user is not None:
    return _user
  if os.geteuid() != 0:
    pytest.skip(f'needs root to make and become another Unix user ({NAME}); '
                f'running as uid {os.geteuid()}.')
  useradd = shutil.which('useradd', path=_PATH)
  if useradd is None:
    pytest.skip('useradd is missing: cannot make another Unix user.')
  runuser, setpriv = (shutil.which(c, path=_PATH)
                      for c in ('runuser', 'setpriv'))
  if runuser is None and setpriv is None:
    pytest.skip('runuser and setpriv are missing: cannot run code as '
                'another Unix user.')
  entry = _make_user(useradd)
  switch = ([runuser, '-u', NAME, '--'] if runuser else
            [setpriv, f'--reuid={entry.pw_uid}', f'--regid={entry.pw_gid}',
             '--clear-groups'])
  home = tempfile.mkdtemp(prefix=f'{NAME}_home_')
  os.chown(home, entry.pw_uid, entry.pw_gid)
  atexit.register(shutil.rmtree, home, True)
  reasons = []
  for python, pythonpath in _interpreters():
    user = OtherUser(NAME, entry.pw_uid, entry.pw_gid, home, python,
                     pythonpath, switch)
    done = user.run_python('import smart_replay', timeout_s=_PROBE_TIMEOUT_S)
    if done.returncode == 0:
      _user = user
      return user
    last = (done.stderr.strip().splitlines() or ['?'])[-1]
    reasons.append(f'{python}: {last}')
  pytest.skip(f'no Python that {NAME} can run imports smart_replay: '
              + '; '.join(reasons))


def _make_user(useradd: str) -> pwd.struct_passwd:
  """`useradd` once; another process making it at the same time is fine."""
  error = ''
  for attempt in range(_USERADD_ATTEMPTS):
    try:
      return pwd.getpwnam(NAME)
    except KeyError:
      pass
    done = subprocess.run(
        [useradd, '--system', '--no-create-home', '--user-group',
         '--shell', '/usr/sbin/nologin', NAME],
        capture_output=True, text=True, check=False)
    error = done.stderr.strip()
    if done.returncode != 0:  # E.g. /etc/passwd locked by a parallel run.
      time.sleep(0.2 * (attempt + 1))
  try:
    return pwd.getpwnam(NAME)
  except KeyError:
    pytest.skip(f'useradd could not make the user {NAME}: {error}')


def _interpreters() -> List[tuple]:
  """(python, PYTHONPATH) to try, best first."""
  candidates = [(sys.executable, ROOT)]
  version = f'python{sys.version_info.major}.{sys.version_info.minor}'
  system = shutil.which(version, path='/usr/local/bin:/usr/bin:/bin')
  if system and os.path.realpath(system) != os.path.realpath(sys.executable):
    site = []
    for key in ('purelib', 'platlib'):
      path = sysconfig.get_path(key)
      if path not in site:
        site.append(path)
    candidates.append((system, os.pathsep.join([ROOT, *site])))
  return candidates
