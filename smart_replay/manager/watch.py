"""The manager's one watcher: which servers answer, told to whom it concerns.

In client mode a server can stop answering or be restarted under the
manager. One daemon thread per manager (`Watcher`) asks the backend every
`watch_interval_s` (`Backend.check_servers`: which instance of each server
answers, and what changed) and tells, never asks, the parts below it:

* the datasets' batchers: a shard that stopped answering gets no share of
  the next batches, one that answers again gets a new Reverb stream
  (`Batcher.source_down`, `source_up`), and a waiting batch checks its
  timeout (`Batcher.tick`);
* the priority updates: a shard that is down gets none (`shards_up`);
* the observers: the items a restart of their server lost are counted
  (`TrajectoryObserver.count_restart_loss`, once per restart, whichever of
  the watcher, `flush()` and `checkpoint()` sees it first).

An observer whose write waited for the server sets `wake` (a
`threading.Event` it holds), and the watcher checks at once. The thread is
stopped (and waited for, a bounded time) when the manager closes, or when
the interpreter exits without that.
"""

import atexit
import threading
import weakref
from typing import Any, Callable, List

from absl import logging

from smart_replay.backends import base as backend_lib
from smart_replay.backends import instances
from smart_replay.manager import state as state_lib

# How long one server may take to answer a check.
CHECK_TIMEOUT_S = 1.0


def count_restart(state: state_lib.State, instance: Any) -> None:
  """Tells every observer of the running buffer what a restart of its
  server lost.

  Args:
    state: the manager's state.
    instance: the restarted server's new instance (`Backend.restarted`), or
      None (nothing to count).
  """
  if instance is None:
    return
  with state.lock:
    running = state.running
    for observer in running.observers if running else ():
      observer.count_restart_loss(instance.get('restored_save_started'),
                                  instance.get('started_unix'))


class Watcher:
  """A daemon thread telling what the backend's server checks find.

  Args:
    backend: the manager's backend (`watch_interval_s` is set).
    state: the manager's state (its observers and batchers).

  Attributes:
    wake: set it to have the servers checked at once.
  """

  def __init__(self, backend: backend_lib.Backend, state: state_lib.State):
    self._backend, self._state = backend, state
    self._interval_s = backend.watch_interval_s
    self.wake = threading.Event()
    self._stopped = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name='smart_replay-watch')
    self._thread.start()
    atexit.register(_stop_at_exit, weakref.ref(self))

  def _run(self) -> None:
    while not self._stopped.is_set():
      self.wake.wait(self._interval_s)
      self.wake.clear()
      if self._stopped.is_set():
        return
      try:
        self.check()
      except Exception as e:  # pylint: disable=broad-except
        # A check must never end the thread: the next one asks again.
        logging.warning('Checking the servers failed: %s', e)

  def check(self) -> None:
    """One round: asks the servers, tells the batchers and the observers."""
    changes = self._backend.check_servers(CHECK_TIMEOUT_S)
    batchers = self._batchers()
    running = self._state.running
    up = running.shards_up if running else None  # None: one server.
    for change in changes:
      if up is not None:
        up[change.server].assign(change.kind != instances.DOWN)
      for batcher in batchers:
        if change.kind == instances.DOWN:
          batcher.source_down(change.server)
        else:
          batcher.source_up(change.server, new_stream=True)
    for batcher in batchers:
      batcher.tick()
    for change in changes:  # The writers' server restarted: its loss.
      if (change.server == self._backend.writer_server and
          change.kind == instances.RESTARTED):
        count_restart(self._state, self._backend.restarted(
            patient=False, answered=change.instance))

  def _batchers(self) -> List[Any]:
    running = self._state.running
    return list(running.batchers) if running else []

  def stop(self) -> None:
    """Stops the checks; waits (bounded) for one in progress."""
    self._stopped.set()
    self.wake.set()
    if self._thread is not threading.current_thread():
      self._thread.join(timeout=10 * CHECK_TIMEOUT_S)


def _stop_at_exit(watcher: Callable[[], Watcher]) -> None:
  """Stops a watcher still running when the interpreter exits (its thread
  must not come back from a call into gRPC while Python finalizes)."""
  live = watcher()
  if live is not None:
    live.stop()
