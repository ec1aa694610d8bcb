"""Checkpoints clients ask for over the network, coalesced.

A client asks for a checkpoint after flushing its writers, so the checkpoint
it gets back must begin after its request arrived. `CheckpointRequests`
gives every request such a checkpoint while saving as little as it can: a
request that arrives while a save runs joins the next save of the same
`extra` (the first such request leads it; the others wait for its result),
which begins once the running save ends. A flood of requests then costs one
save per distinct `extra` at a time, not one per request, and `Spacing`
starts the saves clients ask for (these and coordinated ones) at least
`MIN_INTERVAL_S` apart, so a token holder looping requests with distinct
`extra`s cannot keep the disk writing. Their manifests
carry `coordinated_records.REQUESTED_KEY`, which puts them in a retention group of
their own: client requests never prune the checkpoints the server made.
"""

import concurrent.futures
import contextlib
import json
import threading
import time
from typing import Any, Callable, ContextManager, Dict, Iterator

from smart_replay.storage import coordinated_records

# Seconds between the end of a save a client asked for and the start of the
# next one.
MIN_INTERVAL_S = 1.0


class Spacing:
  """Starts what it guards at least `min_interval_s` after the last ended.

  Args:
    min_interval_s: the least time between the end of one and the start of
      the next; 0: no spacing.
  """

  def __init__(self, min_interval_s: float = MIN_INTERVAL_S):
    if isinstance(min_interval_s, bool) or not isinstance(
        min_interval_s, (int, float)) or not min_interval_s >= 0:
      raise ValueError('min_interval_s must be a number >= 0, got '
                       f'{min_interval_s!r}.')
    self._min_interval_s = float(min_interval_s)
    self._lock = threading.Lock()
    self._ended = -float('inf')

  @contextlib.contextmanager
  def spaced(self) -> Iterator[None]:
    """Waits for its turn (one at a time), runs the body, notes its end."""
    with self._lock:
      wait = self._ended + self._min_interval_s - time.monotonic()
      if wait > 0:
        time.sleep(wait)
      try:
        yield
      finally:
        self._ended = time.monotonic()


class CheckpointRequests:
  """Coalesces client-requested checkpoints (module docstring).

  Args:
    save: writes one checkpoint with the given `extra` (the request's, and
      `REQUESTED_KEY`); returns its path.
    saving: held by every save of the server (requested or not), so that a
      round's save begins after the running one ends.
    spacing: spaces the saves clients ask for (shared with coordinated
      saves).
  """

  def __init__(self, save: Callable[[Dict[str, Any]], str],
               saving: ContextManager[Any], *, spacing: Spacing):
    self._save, self._saving, self._spacing = save, saving, spacing
    self._rounds: Dict[str, concurrent.futures.Future] = {}
    self._lock = threading.Lock()

  def request(self, extra: Dict[str, Any]) -> str:
    """A checkpoint that begins after this call, shared with the requests
    of the same `extra` that arrive before it begins.

    Args:
      extra: the manifest's metadata (JSON-serializable).

    Returns:
      The checkpoint's path.

    Raises:
      Whatever the save raised (every request of its round gets it).
    """
    key = json.dumps(extra, sort_keys=True)
    with self._lock:
      waiting = self._rounds.get(key)
      leader = waiting is None
      if leader:
        waiting = self._rounds[key] = concurrent.futures.Future()
    if not leader:
      return waiting.result()
    # After the save in progress, if any, and spaced from the last asked for.
    with self._spacing.spaced(), self._saving:
      with self._lock:
        del self._rounds[key]  # Requests from now on make the next round.
      try:
        path = self._save({**extra, coordinated_records.REQUESTED_KEY: True})
      except BaseException as e:
        waiting.set_exception(e)
        raise
      waiting.set_result(path)
      return path
