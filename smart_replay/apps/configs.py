"""The gin configs shipped with the package, found by name.

`configs/*.gin` are installed as package data of `smart_replay_configs`, so
`--gin_file=populate_thermal.gin` (or `populate_thermal`, or the documented
`configs/populate_thermal.gin`) works from any directory and in a wheel,
while an existing path always wins: a user's own file is never shadowed.
"""

import importlib.resources
import os
from typing import List

PACKAGE = 'smart_replay_configs'


def shipped() -> List[str]:
  """Names the shipped configs.

  Returns:
    Sorted file names, e.g. `['default.gin', ...]`.
  """
  root = importlib.resources.files(PACKAGE)
  return sorted(entry.name for entry in root.iterdir()
                if entry.name.endswith('.gin'))


def resolve(name: str) -> str:
  """Finds a gin file by path, else among the shipped configs by name.

  Args:
    name: a path; or a shipped config's file name, with or without `.gin`,
      optionally as `configs/<name>` (the repository's layout).

  Returns:
    A path gin can open.

  Raises:
    FileNotFoundError: neither a file nor a shipped config; the message lists
      the shipped ones.
  """
  if os.path.isfile(name):
    return name
  base = os.path.basename(name)
  if not base.endswith('.gin'):
    base += '.gin'
  if os.path.dirname(name) in ('', 'configs') and base in shipped():
    return str(importlib.resources.files(PACKAGE) / base)
  raise FileNotFoundError(
      f'no such file, and no shipped config of that name (shipped: '
      f'{", ".join(shipped())})')
