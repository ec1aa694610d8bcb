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
* the observers: after a restart of their server, those that keep what
  they sent send again what the server lacks (`after_restart`), the others
  count what the restart lost (`TrajectoryObserver.count_restart_loss`);
  once per restart, whichever of the watcher, `flush()` and `checkpoint()`
  sees it first; between restarts they let go of what the server's newest
  checkpoint holds (`prune`).

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

from smart_replay import errors
from smart_replay.backends import base as backend_lib
from smart_replay.backends import instances
from smart_replay.manager import state as state_lib

# How long one server may take to answer a check.
CHECK_TIMEOUT_S = 1.0


def after_restart(state: state_lib.State, backend: backend_lib.Backend,
                  instance: Any) -> None:
  """After a restart of the observers' server: each observer that keeps
  what it sent sends again what the server lacks; the others count what
  the restart lost.

  A restore someone asked for (a reload, a coordinated restore) is not
  undone: observers count what it lost, and those that keep what they sent
  let go of it (`resending.Resender.forget_sent`). After a restart, an
  observer that keeps what it sent (`TrajectoryObserver.retains`) is
  flushed (every item it made is then stored or lost, none on its way),
  asks the server what it holds of its items now (`Backend.writer_marks`,
  an exact snapshot) and sends again the items above that
  (`resending.Resender.resend`), all under the manager's lock, so that no
  new step comes between. A re-send that fails (the server went down
  again) is tried again at the next check (`Resender.pending`).

  Args:
    state: the manager's state.
    backend: the manager's backend.
    instance: the restarted server's new instance (`Backend.restarted`), or
      None (nothing to count, but a pending re-send is tried again).
  """
  running = state.running
  if instance is None and not any(
      o.resender and o.resender.pending
      for o in (running.observers if running else ())):
    return
  with state.lock:
    running = state.running
    for observer in running.observers if running else ():
      requested = instance is not None and instance.get('restored_on_request')
      if observer.retains and not requested:
        if instance is not None or observer.resender.pending:
          resend(observer, backend)
      elif instance is not None:
        observer.count_restart_loss(instance.get('restored_save_started'),
                                    instance.get('started_unix'))
        if observer.retains:  # The buffer is to be as that checkpoint was.
          observer.resender.forget_sent()


def prune(state: state_lib.State, backend: backend_lib.Backend) -> None:
  """Lets each observer that keeps what it sent go of what the server's
  newest checkpoint holds (`resending.Resender.prune`); a server that does
  not answer is asked again at the next check."""
  running = state.running
  for observer in list(running.observers) if running else ():
    if not observer.retains or observer.resender.pending:
      continue
    try:
      observer.resender.prune(backend.writer_marks(observer.writer_id))
    except errors.SmartReplayError as e:
      logging.info('Asking the server at %s for the marks of writer %s '
                   'failed (%s); asked again at the next check.',
                   backend.where, observer.writer_id, e)


def resend(observer: Any, backend: backend_lib.Backend) -> None:
  """Flushes an observer and sends again what the server lacks (call it
  with the manager's lock held); a failure leaves it pending (logged), for
  the next check."""
  resender = observer.resender
  resender.pending = True
  try:
    observer.flush()
    resender.resend(backend.writer_marks(
        observer.writer_id, live=True, above=resender.floor()))
    resender.resend_done(backend.writer_marks(observer.writer_id)['number'])
  except errors.SmartReplayError as e:
    logging.warning(
        'Sending again what the restarted server at %s lacks of writer %s '
        'failed (%s: %s); it is tried again at the next check.',
        backend.where, observer.writer_id, type(e).__name__, e)
    return


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
        after_restart(self._state, self._backend, self._backend.restarted(
            patient=False, answered=change.instance))
        break
    else:  # A re-send that failed is tried again; what is saved goes.
      after_restart(self._state, self._backend, None)
      if self._backend.resends:
        prune(self._state, self._backend)

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
