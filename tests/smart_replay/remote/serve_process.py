"""`smart-replay-serve` processes and spawned workers for the remote tests.

`served` is a fixture starting real `smart-replay-serve` processes (killed
at the end of the test), all with one control token file, which the test's
clients and spawned workers find through `$SMART_REPLAY_CONTROL_TOKEN_FILE`;
their Reverb port listens on 127.0.0.1 (the default `--reverb_host`), the
address `ServeProcess.address` gives;
`start`, `get` and `wait_until` start worker processes, collect their reports
and wait on conditions, each with a timeout that fails the test instead of
hanging it.
"""

import json
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import time

import pytest

import smart_replay
from smart_replay.control import credentials
from smart_replay.remote import serving_record
from smart_replay.spec import specs
from tests import testing
from tests.smart_replay.remote import in_process_shards
from tests.smart_replay.remote import remote_workers

ROOT = testing.ROOT
# Workers fork from a server process that has loaded TensorFlow, Reverb,
# TF-Agents and smart_replay once (`remote_workers`, which makes no server,
# client or thread of theirs at import), instead of each importing them again
# (about 6 s of CPU per spawned process). A forked worker has the server
# process's environment, so `start` passes the variables workers read.
WORKERS = multiprocessing.get_context('forkserver')
WORKERS.set_forkserver_preload(['tests.smart_replay.remote.remote_workers',
                               'smart_replay.manager.facade'])
_PASSED_ENV = (credentials.TOKEN_FILE_ENV, credentials.TOKEN_ENV)


class ServeProcess:
  """`smart-replay-serve` in a subprocess; its log is read on demand."""

  def __init__(self, tmp_path, checkpoint_dir, port, *bindings,
               flags=()):
    spec_file = str(tmp_path / 'spec.pbtxt')
    if not os.path.exists(spec_file):
      specs.save_spec(spec_file, remote_workers.data_spec())
    self.token_file, identity = in_process_shards.shared_credentials(
        str(tmp_path))
    self.log_path = str(tmp_path / f'serve-{time.monotonic_ns()}.log')
    self._log = open(self.log_path, 'w')
    self.process = subprocess.Popen(
        [sys.executable, '-m', 'smart_replay_scripts.serve',
         f'--spec_file={spec_file}', f'--checkpoint_dir={checkpoint_dir}',
         f'--port={port}', f'--control_token_file={self.token_file}',
         f'--control_tls_cert_file={identity}',
         f'--control_tls_key_file={identity}',
         *flags,
         '--gin_bindings=ReplayBufferManager.capacity=100000',
         '--gin_bindings=ReplayServer.log_every_s=1.0'] +
        [f'--gin_bindings={b}' for b in bindings],
        stdout=self._log, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    self.port = port
    self.checkpoint_dir = checkpoint_dir
    self.address = f'127.0.0.1:{port}'  # Reverb's default --reverb_host.
    self.wait_for('Serving ', 120)

  def log(self):
    with open(self.log_path) as f:
      return f.read()

  def wait_for(self, text, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      if text in self.log():
        return
      if self.process.poll() is not None:
        raise AssertionError(f'server exited {self.process.returncode}:\n'
                             f'{self.log()[-3000:]}')
      time.sleep(0.2)
    raise AssertionError(f'no {text!r} in the server log within {timeout_s} '
                         f's:\n{self.log()[-3000:]}')

  def stop(self, sig=signal.SIGTERM, timeout_s=120):
    if self.process.poll() is None:
      self.process.send_signal(sig)
    code = self.process.wait(timeout_s)
    self._log.close()
    return code


def shared_token_file(tmp_path):
  """The control token file of a test's servers (made once, mode 0600; it
  carries the certificate they share, `in_process_shards`)."""
  return in_process_shards.shared_credentials(str(tmp_path))[0]


@pytest.fixture
def served(tmp_path, monkeypatch):
  servers = []
  monkeypatch.setenv(credentials.TOKEN_FILE_ENV,
                     shared_token_file(tmp_path))

  def start(*bindings, checkpoint_dir=None, port=None, flags=()):
    server = ServeProcess(tmp_path, checkpoint_dir or str(tmp_path / 'buffer'),
                          port or remote_workers.free_port_pair(), *bindings,
                          flags=flags)
    servers.append(server)
    return server

  yield start
  for server in servers:
    if server.process.poll() is None:
      server.stop(signal.SIGKILL)


def served_writer(served, checkpoint_dir, **client_kwargs):
  """A server on `checkpoint_dir` and a client writing chunks of 4 steps."""
  server = served(checkpoint_dir=checkpoint_dir)
  manager, observer = remote_workers.client(server.address, chunk_length=4,
                                            **client_kwargs)
  return server, manager, observer


def kill_after_unsaved_items(served, checkpoint_dir, steps, **client_kwargs):
  """A client writes `steps[:10]`, checkpoints, writes `steps[10:16]`
  (confirmed, not saved), then the server is killed; returns `(server,
  manager, observer)`."""
  server, manager, observer = served_writer(served, checkpoint_dir,
                                            **client_kwargs)
  try:
    for step in steps[:10]:
      observer(step)
    manager.checkpoint()  # Holds items (1,2)..(9,10).
    for step in steps[10:16]:
      observer(step)
    observer.flush()  # Confirmed by the server, but in no checkpoint.
    wait_until(lambda: (serving_record.read(checkpoint_dir) or {}).get(
        'inserts') == 15, 'the server to record its 15 inserts')
    server.stop(signal.SIGKILL)
  except BaseException:
    manager.close()
    raise
  return server, manager, observer


def newest_checkpoint(checkpoint_dir):
  """`(path, items)` of the newest complete checkpoint, or `(None, None)`."""
  found = smart_replay.ReplayBufferManager(
      data_spec=remote_workers.data_spec(), capacity=1,
      checkpoint_dir=checkpoint_dir).existing_checkpoints()
  if not found:
    return None, None
  with open(os.path.join(found[-1], 'manifest.json')) as f:
    manifest = json.load(f)
  return found[-1], manifest['counts']['tables']['experience']['items']


def wait_until(condition, what, timeout_s=60):
  deadline = time.monotonic() + timeout_s
  while not condition():
    if time.monotonic() > deadline:
      raise AssertionError(f'timed out after {timeout_s} s waiting for {what}')
    time.sleep(0.05)


def start(target, *args):
  """Starts `target(*args)` in a worker process (with this process's token
  variables)."""
  env = {name: os.environ.get(name) for name in _PASSED_ENV}
  process = WORKERS.Process(target=_with_env, args=(env, target) + args,
                            daemon=True)
  process.start()
  return process


def _with_env(env, target, *args):
  for name, value in env.items():
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value
  target(*args)


def get(results, count, timeout_s=240):
  got = []
  deadline = time.monotonic() + timeout_s
  while len(got) < count:
    try:
      got.append(results.get(timeout=max(1, deadline - time.monotonic())))
    except queue.Empty:
      raise AssertionError(f'only {len(got)} of {count} results within '
                           f'{timeout_s} s') from None
  return got


