"""The optional packages of the benchmark harness, imported when needed.

psutil (server memory) and matplotlib (the chart) come with the `bench`
extra, not with smart_replay itself; a missing one is reported with the
command that installs it.
"""

import importlib
import importlib.util
import types

INSTALL_HINT = "pip install 'smart_replay[bench]' (or make install)"
# The optional modules: what each is needed for.
NEEDED_FOR = {
    'psutil': "to measure the benchmark servers' memory",
    'matplotlib': 'to draw the benchmark chart',
}


def _missing(module: str) -> ImportError:
  return ImportError(f'{module} is needed {NEEDED_FOR[module]} but is not '
                     f'installed: {INSTALL_HINT}.')


def check_installed(*modules: str) -> None:
  """Fails early, without importing them, if optional modules are missing.

  Args:
    *modules: keys of `NEEDED_FOR`.

  Raises:
    ImportError: for the first module that is not installed; the message
      says how to install it.
  """
  for module in modules:
    if importlib.util.find_spec(module) is None:
      raise _missing(module)


def require(module: str) -> types.ModuleType:
  """Imports an optional module of the benchmark harness.

  Args:
    module: a key of `NEEDED_FOR`.

  Returns:
    The imported module.

  Raises:
    ImportError: if it is not installed; the message says how to install it.
  """
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise _missing(module) from e
