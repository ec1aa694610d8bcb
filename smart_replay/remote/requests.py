"""Checkpoints clients ask for over the network, coalesced.

A client asks for a checkpoint after flushing its writers, so the checkpoint
it gets back must begin after its request arrived. `CheckpointRequests`
gives every request such a checkpoint while saving as little as it can: a
request that arrives while a save runs joins the next save of the same
`extra` (the first such request leads it; the others wait for its result),
which begins once the running save ends. A flood of requests then costs one
save per distinct `extra` at a time, not one per request. Their manifests
carry `coordinated_records.REQUESTED_KEY`, which puts them in a retention group of
their own: client requests never prune the checkpoints the server made.
"""

import concurrent.futures
import json
import threading
from typing import Any, Callable, ContextManager, Dict

from smart_replay.storage import coordinated_records


class CheckpointRequests:
  """Coalesces client-requested checkpoints (module docstring).

  Args:
    save: writes one checkpoint with the given `extra` (the request's, and
      `REQUESTED_KEY`); returns its path.
    saving: held by every save of the server (requested or not), so that a
      round's save begins after the running one ends.
  """

  def __init__(self, save: Callable[[Dict[str, Any]], str],
               saving: ContextManager[Any]):
    self._save, self._saving = save, saving
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
    with self._saving:  # After the save in progress, if any.
      with self._lock:
        del self._rounds[key]  # Requests from now on make the next round.
      try:
        path = self._save({**extra, coordinated_records.REQUESTED_KEY: True})
      except BaseException as e:
        waiting.set_exception(e)
        raise
      waiting.set_result(path)
      return path
