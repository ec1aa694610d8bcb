"""When a served buffer's next checkpoint is due, and retries after failures.

`CheckpointSchedule` keeps the newest checkpoint of a `ReplayServer` (its
path, when it was written, the insert and sample counters it holds) and says
when the next scheduled one is due: every N seconds, every N inserted items,
and once unsaved items are too old. After a failed scheduled checkpoint it
waits `retry_s` before the next try, and remembers since when and why
checkpoints fail, for the status line.
"""

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from absl import logging

from smart_replay import errors
from smart_replay.storage import files as checkpoint_files
from smart_replay.storage import checkpoint_folders
from smart_replay.storage import manifest as manifest_lib
from smart_replay.utils import checks

Counts = Tuple[int, int]  # (inserts, samples) over all tables.


def total_counts(stats: Dict[str, Any]) -> Counts:
  """Sums the insert and sample counters of all tables.

  Args:
    stats: `ReplayBufferManager.stats()`.

  Returns:
    `(inserts, samples)`.
  """
  return tuple(sum(t[key] for t in stats['tables'].values())
               for key in ('inserts', 'samples'))


def saved_counts(path: str) -> Counts:
  """Sums the insert and sample counters of the buffer's tables the
  checkpoint at `path` holds.

  Only the tables its manifest configures count (as `total_counts` sums
  `stats()['tables']`): a table served beside them, such as the policy
  variables (`config.variables`), is not part of the buffer. The live
  counters may already be ahead: clients write meanwhile.

  Args:
    path: a checkpoint folder (with its manifest).

  Returns:
    `(inserts, samples)` over the buffer's tables.
  """
  names = {t['name'] for t in manifest_lib.read(
      os.path.join(path, manifest_lib.MANIFEST_NAME))['tables']}
  counters = [c for name, c in
              checkpoint_files.read_table_counters(path).items()
              if name in names]
  return (sum(c['inserts'] for c in counters),
          sum(c['samples'] for c in counters))


class CheckpointSchedule:
  """The checkpoint schedule and retry policy of a `ReplayServer`.

  Args:
    every_s: a checkpoint this many seconds after the last one (None: no
      time schedule).
    every_inserts: a checkpoint once this many items were inserted since the
      last one (None: no insert schedule).
    max_unsaved_s: a checkpoint once items inserted since the last one are
      this many seconds old, whatever the schedules say, so the tail of an
      insert-count schedule is saved too (None: no bound; unsaved items are
      lost with the process).
    retry_s: seconds to wait after a failed scheduled checkpoint (e.g. a
      full disk); serving goes on meanwhile.

  Attributes:
    last_checkpoint: the newest checkpoint written or restored, or None.
    last_counts: `(inserts, samples)` it holds.
    last_time: `time.monotonic()` when it was written (or serving began).
    last_duration_s: how long the last checkpoint written took, or None.
    written: checkpoints written since serving began.
    failing_since: `(monotonic time of the first failure, message of the
      latest)` while scheduled checkpoints fail, else None.
    retry_at: when a failed scheduled checkpoint may be tried again.

  Raises:
    ValueError: if an argument is not a positive number (every_inserts: an
      integer), or `retry_s` is None; names it and its value.
  """

  def __init__(self, *, every_s: Optional[float],
               every_inserts: Optional[int], max_unsaved_s: Optional[float],
               retry_s: float):
    for name, value in (('checkpoint_every_s', every_s),
                        ('checkpoint_every_inserts', every_inserts),
                        ('max_unsaved_s', max_unsaved_s)):
      if value is not None:
        checks.positive(name, value,
                        integer=name == 'checkpoint_every_inserts')
    checks.positive('checkpoint_retry_s', retry_s)
    self._every_s = every_s
    self._every_inserts = every_inserts
    self._max_unsaved_s = max_unsaved_s
    self.retry_s = float(retry_s)
    self.last_checkpoint = None
    self.last_counts = None
    self.last_time = None
    self.last_duration_s = None
    self.written = 0
    self.failing_since = None
    self.retry_at = 0.0
    # When items were first inserted after the last checkpoint (None: none).
    self._unsaved_since = None

  def record(self, path: str, counts: Counts, now: float, *,
             duration_s: Optional[float] = None) -> None:
    """Takes note of a checkpoint written now.

    A checkpoint older than the newest one known (two writers racing) only
    restarts the clock; checkpoints are compared by their number (`ckpt-N`),
    not as strings.

    Args:
      path: the checkpoint folder.
      counts: `(inserts, samples)` it holds.
      now: `time.monotonic()`.
      duration_s: how long writing it took; None for a resumed one.
    """
    if (self.last_checkpoint is None or
        _number(path) > _number(self.last_checkpoint)):
      self.last_checkpoint, self.last_counts = path, counts
    self.last_time = now
    if duration_s is not None:
      self.last_duration_s = duration_s
      self.written += 1

  def restored(self, path: str, counts: Counts, now: float) -> None:
    """Takes note that the buffer was restored in place from `path` (an
    older checkpoint): it is what the buffer now holds.

    Args:
      path: the restored checkpoint folder.
      counts: `(inserts, samples)` it holds.
      now: `time.monotonic()`.
    """
    self.last_checkpoint, self.last_counts = path, counts
    self.last_time = now
    self._unsaved_since = None

  def holds(self, counts: Counts) -> bool:
    """Tells whether the last checkpoint holds these counters.

    Args:
      counts: `(inserts, samples)` now.

    Returns:
      True if nothing was inserted or sampled since the last checkpoint.
    """
    return tuple(counts) == tuple(self.last_counts)

  def due(self, counts: Counts, now: float) -> Optional[str]:
    """Says whether a scheduled checkpoint should be written now.

    A due checkpoint is skipped (and the clock restarted) while nothing was
    inserted or sampled since the last one, and postponed until `retry_at`
    after a failure.

    Args:
      counts: `(inserts, samples)` now.
      now: `time.monotonic()`.

    Returns:
      Why it is due (for the log line), or None.
    """
    inserts = counts[0]
    last_inserts = self.last_counts[0]
    if inserts == last_inserts:
      self._unsaved_since = None
    elif self._unsaved_since is None:
      self._unsaved_since = now
    due: List[str] = []
    if self._every_s and now - self.last_time >= self._every_s:
      due.append(f'every {self._every_s:g} s')
    if self._every_inserts and inserts - last_inserts >= self._every_inserts:
      due.append(f'{inserts - last_inserts} inserts')
    if (self._max_unsaved_s and self._unsaved_since is not None and
        now - self._unsaved_since >= self._max_unsaved_s):
      due.append(f'{inserts - last_inserts} inserts unsaved for '
                 f'{now - self._unsaved_since:.0f} s')
    if due and self.holds(counts):
      self.last_time = now  # Nothing changed: nothing to save.
      return None
    if due and now >= self.retry_at:
      return ' and '.join(due)
    return None

  def attempt(self, save: Callable[[], str], now: float) -> Optional[str]:
    """Writes a due checkpoint; a failure is logged and retried later
    (`failed`), not raised: serving goes on.

    Args:
      save: writes the checkpoint; returns its path.
      now: `time.monotonic()` when it is tried.

    Returns:
      The checkpoint's path, or None if it failed.
    """
    try:
      path = save()
    except (errors.WaitTimeoutError, errors.CheckpointCorruptError,
            OSError) as e:  # CheckpointWriteError is an OSError.
      self.failed(e, now)
      return None
    self.succeeded(now)
    return path

  def failed(self, error: Exception, now: float) -> None:
    """Logs a failed scheduled checkpoint and postpones the next try.

    Args:
      error: what the checkpoint raised.
      now: `time.monotonic()` when it was tried.
    """
    first = now if self.failing_since is None else self.failing_since[0]
    self.failing_since = (first, str(error))  # The latest cause.
    self.retry_at = now + self.retry_s
    logging.error('Scheduled checkpoint failed (retrying in %g s; serving '
                  'goes on, items since the last checkpoint are not saved '
                  'yet): %s', self.retry_s, error)

  def succeeded(self, now: float) -> None:
    """Ends a run of failures (logging how long it lasted), if any.

    Args:
      now: `time.monotonic()` when the scheduled checkpoint was tried.
    """
    if self.failing_since is not None:
      logging.warning('Checkpointing works again after failing for %.0f s.',
                      now - self.failing_since[0])
    self.failing_since, self.retry_at = None, 0.0


def _number(path: str) -> int:
  """A checkpoint's number N (`ckpt-N`); -1 for another name."""
  number = checkpoint_folders.checkpoint_number(path)
  return -1 if number is None else number
