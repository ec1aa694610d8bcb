"""When a writer's items were sent and confirmed, to count what a restart lost.

A server that is killed and resumes its last checkpoint has lost every item it
stored after that save copied its tables. The server cannot tell each writer
which of its items those were; the writer can, if it remembers when it sent
its confirmed items and when it saw them confirmed: `ConfirmationLog` keeps
`(sent, seen, items confirmed so far)` in bounded memory (exact for recent
entries, thinned for old ones).

An item the restart lost was sent after the restored save began (it reached
the server after the copy) and was confirmed by the server that died, so its
confirmation was seen before the new server started: an item seen confirmed
later was (re)sent to the new server, which holds it (Reverb's writer sends
its unconfirmed items again after a reconnect). Dating by what the writer
saw, not by when it noticed a reconnect, keeps this true whichever part of
the client notices the restart first. The count is a lower bound, as the
server's own "at least N items" at a resume: an item in flight during the
save is not counted (at most the writer's unconfirmed items, 49), nor one the
old server confirmed that the writer saw only after the new server started.
"""

import time
from typing import List, Optional, Tuple

# Entries kept at most; when full, the older half is thinned to every other
# entry, so recent confirmations keep their exact times and old ones a
# coarser record, in bounded memory.
MAX_ENTRIES = 8192


class ConfirmationLog:
  """A bounded record of when a writer's confirmed items were sent and seen.

  Each entry `(sent, seen, total)` says that the items up to the `total`-th
  were sent by `sent` and seen confirmed by `seen`; entries come in the order
  the items were sent and confirmed (Reverb confirms a stream in order), so
  both times grow. An item whose entry was thinned out counts as sent and
  seen as late as the record allows: `confirmed_after` errs towards counting
  an item as lost, `seen_before` towards counting it as held by a new
  server.

  Attributes:
    total: items confirmed so far.

  Args:
    max_entries: entries kept (>= 4).

  Raises:
    ValueError: if `max_entries` < 4.
  """

  def __init__(self, *, max_entries: int = MAX_ENTRIES):
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or (
        max_entries < 4):
      raise ValueError(f'max_entries must be an integer >= 4, got '
                       f'{max_entries!r}.')
    self._max_entries = max_entries
    self._entries: List[Tuple[float, float, int]] = []
    self.total = 0
    # Until when items lost at a server restart are counted already.
    self._lost_counted_until = 0.0

  def add(self, count: int, *, sent: Optional[float] = None,
          seen: Optional[float] = None) -> None:
    """Records that `count` more items, sent at `sent`, were seen confirmed
    at `seen`.

    Args:
      count: items newly confirmed; nothing happens for 0 or less.
      sent: when they were sent, wall time (`time.time()` scale); default
        `seen`.
      seen: when their confirmation was seen, wall time; default now.
    """
    if count <= 0:
      return
    seen = time.time() if seen is None else seen
    self.total += count
    self._entries.append((seen if sent is None else sent, seen, self.total))
    if len(self._entries) > self._max_entries:
      half = len(self._entries) // 2
      self._entries[:half] = self._entries[1:half:2]

  def confirmed_after(self, when: float) -> int:
    """Confirmed items sent at or after wall time `when` (an upper bound,
    see above).

    Args:
      when: a wall time (`time.time()` scale).

    Returns:
      The number of items, >= 0.
    """
    return self.total - self._total_before(0, when)

  def seen_before(self, when: float) -> int:
    """Items seen confirmed before wall time `when` (a lower bound).

    Args:
      when: a wall time (`time.time()` scale).

    Returns:
      The number of items, >= 0.
    """
    return self._total_before(1, when)

  def _total_before(self, field: int, when: float) -> int:
    """The total of the last entry whose time `field` (0: sent, 1: seen) is
    before `when` (both grow along the entries), or 0."""
    before = 0
    for entry in self._entries:
      if entry[field] >= when:
        break
      before = entry[2]
    return before

  def lost_at_restart(self, saved_since: Optional[float],
                      restarted: Optional[float] = None) -> int:
    """Items a server restart lost that an earlier call did not count.

    The server lost the items sent after the restored checkpoint's save
    began that it confirmed before it died: those seen confirmed before the
    new server started (see the module's docstring). Items sent before an
    earlier call are not counted again.

    Args:
      saved_since: when the restored checkpoint's save began (wall time), or
        None if the server restored no checkpoint (every confirmed item is
        lost).
      restarted: when the new server started (wall time): items seen
        confirmed later are held by it, so they are not counted; None: no
        limit.

    Returns:
      The number of items, >= 0.
    """
    since = max(saved_since or 0.0, self._lost_counted_until)
    lost = self.confirmed_after(since)
    if restarted is not None:
      lost = max(0, lost - (self.total - self.seen_before(restarted)))
    self._lost_counted_until = time.time()
    return lost
