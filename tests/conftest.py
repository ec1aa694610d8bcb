"""Shared pytest fixtures: real TF-Agents environments and specs; real Reverb."""

import multiprocessing
import sys

import pytest

# Reverb, TensorFlow and TF-Agents load in the fixtures that need them, not
# here: a test file of a pure part (ports, counters, the CLI) then runs
# without importing TensorFlow (about 5 s of every Bazel test target).


@pytest.fixture
def env():
  from tests import testing  # pylint: disable=g-import-not-at-top
  return testing.make_env()


@pytest.fixture
def data_spec(env):
  from tests import testing  # pylint: disable=g-import-not-at-top
  return testing.collect_data_spec(env)


@pytest.fixture
def make_manager(tmp_path, data_spec):
  """Builds managers on tmp dirs and closes them all after the test."""
  import smart_replay  # pylint: disable=g-import-not-at-top
  managers = []

  def factory(checkpoint_dir=None, **kwargs):
    kwargs.setdefault('capacity', 1000)
    kwargs.setdefault('sequence_length', 2)
    kwargs.setdefault('sample_timeout_s', 5.0)
    kwargs.setdefault('write_timeout_s', 5.0)
    manager = smart_replay.ReplayBufferManager(
        data_spec=kwargs.pop('data_spec', data_spec),
        checkpoint_dir=str(checkpoint_dir or tmp_path / 'buffer'), **kwargs)
    managers.append(manager)
    return manager

  yield factory
  for manager in managers:
    manager.close()


@pytest.fixture(autouse=True)
def _unit_tests_start_no_server(request, monkeypatch):
  """A test marked `unit` (run by `make test-fast`) must stay fast and pure:
  starting a Reverb server or a Python worker process fails it (a helper
  command such as numpy's `lscpu` is fine)."""
  if request.node.get_closest_marker('unit') is None:
    return

  def refuse(what):
    def fail(*args, **kwargs):
      del args, kwargs
      raise AssertionError(f'{request.node.nodeid} is marked unit but starts '
                           f'{what}; a unit test runs without one (remove the '
                           'mark if it needs it).')
    return fail
  if 'reverb' in sys.modules:  # Not loaded by this test's module: unpatched.
    monkeypatch.setattr(sys.modules['reverb'].Server, '__init__',
                        refuse('a Reverb server'))
  monkeypatch.setattr(multiprocessing.process.BaseProcess, 'start',
                      refuse('a process'))
