"""When a writer's items were confirmed, to count what a server restart lost.

A server that is killed and resumes its last checkpoint has lost every item it
stored after that save copied its tables. The server cannot tell each writer
which of its items those were; the writer can, if it remembers when it sent
its confirmed items: `ConfirmationLog` keeps `(wall time, items confirmed so
far)`, each confirmed item entered at the time it was sent (the writer records
it so), in bounded memory (exact for recent ones, thinned for old ones), and
answers how many were sent after a given time. An item sent after the save
began reached the server after the copy, so it is lost; one sent just before
and still in flight during the copy is not counted (at most the writer's
unconfirmed items, 49): the count is a lower bound, as the server's own "at
least N items" at a resume. Counting by the time a confirmation was seen
instead would count items that the checkpoint holds.
"""

import time
from typing import List, Optional, Tuple

# Entries kept at most; when full, the older half is thinned to every other
# entry, so recent confirmations keep their exact times and old ones a
# coarser record, in bounded memory.
MAX_ENTRIES = 8192


class ConfirmationLog:
  """A bounded record of when a writer's items were confirmed.

  Each entry `(time, total)` says that `total` items were confirmed by
  `time`. An item whose confirmation time is not known exactly any more
  (thinned out, or dropped) counts as confirmed as late as the record allows,
  so `confirmed_after` errs towards counting an item as lost, never the
  other way round.

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
    self._entries: List[Tuple[float, int]] = []
    self.total = 0
    # Until when items lost at a server restart are counted already.
    self._lost_counted_until = 0.0

  def add(self, count: int, now: Optional[float] = None) -> None:
    """Records that `count` more items were confirmed (at `now`).

    Args:
      count: items newly confirmed; nothing happens for 0 or less.
      now: wall time (`time.time()` scale), default now.
    """
    if count <= 0:
      return
    self.total += count
    self._entries.append((time.time() if now is None else now, self.total))
    if len(self._entries) > self._max_entries:
      half = len(self._entries) // 2
      self._entries[:half] = self._entries[1:half:2]

  def confirmed_after(self, when: float) -> int:
    """Items confirmed after wall time `when` (an upper bound, see above).

    Args:
      when: a wall time (`time.time()` scale).

    Returns:
      The number of items, >= 0.
    """
    before = 0
    for confirmed_at, total in self._entries:
      if confirmed_at >= when:
        break
      before = total
    return self.total - before

  def lost_at_restart(self, saved_since: Optional[float],
                      restarted: Optional[float] = None) -> int:
    """Items a server restart lost that an earlier call did not count.

    The server lost the items sent after the restored checkpoint's save
    began (`confirmed_after`); items counted by an earlier call are not
    counted again.

    Args:
      saved_since: when the restored checkpoint's save began (wall time), or
        None if the server restored no checkpoint (every confirmed item is
        lost).
      restarted: when the new server started (wall time): items sent later
        reached it, so they are not counted; None: no limit.

    Returns:
      The number of items, >= 0.
    """
    since = max(saved_since or 0.0, self._lost_counted_until)
    lost = self.confirmed_after(since)
    if restarted is not None and restarted > since:
      lost -= self.confirmed_after(restarted)
    self._lost_counted_until = time.time()
    return lost
