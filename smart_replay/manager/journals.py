"""An in-process buffer's write-ahead journals, from observer to checkpoint.

Every observer of a buffer with its own folder (`LocalBuffer`) writes a
journal of its own (`writing.journaling`) in `<checkpoint_dir>/journal`,
under a new writer id. `Journals` is the manager's part that:

* makes each observer's journal (`new_journal`);
* at a checkpoint, with the observers flushed and the manager's lock held,
  takes every writer's mark and context (`marks`, recorded in the
  manifest's `counts['journal']`), and starts a new segment of each live
  journal; once the checkpoint is committed (`committed`), deletes what it
  covers: the segments before each live writer's context, and the whole
  journal of a writer that is closed or was replayed;
* keeps each journal about the buffer's capacity long: once a live
  journal holds `capacity` steps (at least `MIN_BOUND_STEPS`) that no
  checkpoint covers, it sets
  `over_bound`, on which the manager takes an automatic checkpoint (kept
  apart by retention: it never displaces one the user took);
* at `clear()` (`cleared`), records it in each live journal and deletes
  the others, whose steps the tables held;
* at a load of the buffer's own folder (`to_replay`), lists the journals to
  run again above the loaded checkpoint's marks (from the last `clear()`
  after them, if any: the restored tables are emptied first), which the
  manager replays through fresh observers. A checkpoint written before journals has no
  marks: nothing is replayed (said once). A journal that no longer holds
  the records the checkpoint needs (its segments were dropped after a newer
  checkpoint that is now damaged) is skipped, loudly: what it held after the
  loaded checkpoint is lost, and the log says which records.
"""

import dataclasses
import os
import threading
from typing import Any, Dict, List, Optional, Sequence

from absl import logging
import numpy as np

from smart_replay.config import options as options_lib
from smart_replay.storage import checkpoint_folders
from smart_replay.storage import journal as journal_lib
from smart_replay.storage import journal_segments as segments_lib
from smart_replay.writing import journaling
from smart_replay.writing import observer as observer_lib

# The manifest's key, in `counts`, of the writers' marks.
MARKS_KEY = 'journal'
# A journal's bound is the buffer's capacity, but at least this many steps
# (a small buffer is not checkpointed every few steps).
MIN_BOUND_STEPS = 10_000
# 'auto' journals a buffer whose steps take at most this many bytes of it.
AUTO_MAX_STEP_BYTES = 4096


@dataclasses.dataclass
class ToReplay:
  """One writer's journal to run again above a checkpoint's mark.

  Attributes:
    contents: the journal, read.
    mark: its last record the checkpoint holds (or its last `clear()`).
    keep_from: the first record replay needs.
    cleared: whether the tables were emptied (`clear()`) after the
      checkpoint: the restored items go before anything is replayed.
  """
  contents: segments_lib.JournalContents
  mark: int
  keep_from: int
  cleared: bool = False

  @property
  def num_envs(self) -> Optional[int]:
    """The journaled observer's `num_envs`."""
    return self.contents.meta.get('num_envs')


class Journals:
  """The write-ahead journals of one in-process buffer (see the module doc).

  Args:
    checkpoint_dir: the buffer's folder; None (a client): no journals.
    sync: `WriteOptions.journal`: 'always', 'every_second', 'off', or False
      for no journals.
    bound_steps: the steps a journal holds above the last checkpoint before
      `over_bound` is set (the buffer's capacity; at least
      `MIN_BOUND_STEPS`); None for no bound.

  Attributes:
    over_bound: set once a live journal holds `bound_steps` steps no
      checkpoint covers; the manager checkpoints and clears it.
  """

  def __init__(self, checkpoint_dir: Optional[str], sync: Any, *,
               bound_steps: Optional[int] = None):
    self.folder = (os.path.join(checkpoint_dir, checkpoint_folders.JOURNAL_DIR)
                   if checkpoint_dir and sync else None)
    self._sync = sync
    self._bound_steps = bound_steps and max(bound_steps, MIN_BOUND_STEPS)
    self.over_bound = threading.Event()
    # The records each live writer's bound allows: {id: records}.
    self._bounds: Dict[str, int] = {}
    # Writers replayed at the load: {id: last record}, until a checkpoint
    # covers them.
    self._replayed: Dict[str, int] = {}
    # The last committed checkpoint's marks; what the load replayed.
    self._marks: Dict[str, Dict[str, int]] = {}
    self._replay_counts = {'writers': 0, 'records': 0, 'items': 0}
    # Checkpoints the manager took on its own to bound the journals.
    self.automatic_checkpoints = 0

  def choose(self, layout: Any, data_spec: Any, *, blocks: bool) -> None:
    """Settles the 'auto' policy once the buffer's layout is known.

    'every_second', unless a step's record would be larger than
    `AUTO_MAX_STEP_BYTES` (images; frame stacks whose records must hold
    whole stacks for packed items): then no journal, said once. A layout
    whose records hold the cells its streams append (`journals_cells`: a
    frame stack's new frames, compressed; about 1 KB a Pong step, insert
    0.89x of none on the Atari benchmark) is journaled. A journal already
    in the folder is kept (it holds what the checkpoint lacks).

    Args:
      layout: the buffer's `protocol.StepLayout`.
      data_spec: the spec of one step.
      blocks: whether a table holds packed items (their records keep the
        call's columns).
    """
    if self._sync != options_lib.JOURNAL_AUTO:
      return
    if layout.journals_cells and not blocks:
      self._sync = journal_lib.DEFAULT_SYNC
      return
    columns = journaling.journal_meta(layout, data_spec, num_envs=None,
                                      tables=())['columns']
    step_bytes = sum(int(np.prod(c['shape'])) * np.dtype(c['dtype']).itemsize
                     for c in columns)
    if step_bytes <= AUTO_MAX_STEP_BYTES or (
        self.folder and segments_lib.segments(self.folder)):
      self._sync = journal_lib.DEFAULT_SYNC
      return
    self._sync, self.folder = False, None
    logging.info(
        'No write-ahead journal for this buffer: a step would take %d bytes '
        'of it (more than %d: images, or frame stacks with packed items), '
        'written as they come and a second of them kept in memory; a crash '
        'loses what came after the last checkpoint. Pass '
        "WriteOptions(journal='every_second') to have one anyway.",
        step_bytes, AUTO_MAX_STEP_BYTES)

  @property
  def enabled(self) -> bool:
    """Whether observers write journals."""
    return self.folder is not None

  def new_journal(self, *, layout: Any, data_spec: Any,
                  num_envs: Optional[int], tables: Sequence[str]
                  ) -> Optional[journal_lib.JournalWriter]:
    """A journal for a new observer, under a new writer id; None if
    journals are off."""
    if not self.enabled:
      return None
    writer = journal_lib.JournalWriter(
        self.folder, writer_id=segments_lib.new_writer_id(), sync=self._sync,
        meta=journaling.journal_meta(layout, data_spec, num_envs=num_envs,
                                     tables=tables))
    if self._bound_steps:  # A record holds one step per environment.
      bound = max(1, self._bound_steps // (num_envs or 1))
      self._bounds[writer.writer_id] = bound
      writer.set_alarm(writer.next_seq + bound, self.over_bound)
    return writer

  def marks(self, observers: Sequence[observer_lib.TrajectoryObserver]
            ) -> Optional[Dict[str, Dict[str, int]]]:
    """Every writer's mark and context for a checkpoint taken now.

    Call with the observers flushed and the manager's lock held. Each live
    journal starts a new segment, so that `committed` can drop the old.

    Returns:
      `{writer id: {'mark', 'keep_from'}}` (closed and replayed writers:
      `keep_from` past their last record), or None if journals are off.
    """
    if not self.enabled:
      return None
    marks = {wid: {'mark': last, 'keep_from': last + 1}
             for wid, last in self._replayed.items()}
    for obs in observers:
      found = obs.journal_marks()
      if found is None:
        continue
      if obs.journal.closed:
        found['keep_from'] = found['mark'] + 1
      else:
        obs.journal.rotate()
      marks[obs.journal.writer_id] = found
    return marks

  def committed(self, observers: Sequence[observer_lib.TrajectoryObserver],
                marks: Optional[Dict[str, Dict[str, int]]]) -> None:
    """Deletes what a committed checkpoint with these marks covers."""
    if not marks:
      return
    self._marks = marks
    live = {}
    for obs in observers:
      if obs.journal is not None and not obs.journal.closed:
        live[obs.journal.writer_id] = obs.journal
    for wid, mark in marks.items():
      if wid in live:
        live[wid].drop_before(mark['keep_from'])
        if wid in self._bounds:
          live[wid].set_alarm(mark['mark'] + 1 + self._bounds[wid],
                              self.over_bound)
      else:
        segments_lib.remove_writer(self.folder, wid)
        self._replayed.pop(wid, None)

  def over(self, observers: Sequence[observer_lib.TrajectoryObserver]
           ) -> bool:
    """Whether a live journal holds more steps than its bound above the
    last committed checkpoint (`over_bound` may have been set by a journal
    a checkpoint since covered)."""
    return any(obs.journal is not None and not obs.journal.closed and
               obs.journal.past_alarm for obs in observers)

  def to_replay(self, manifest: Optional[Dict[str, Any]]) -> List[ToReplay]:
    """The journals to run again above a loaded checkpoint's marks.

    Args:
      manifest: the loaded checkpoint's manifest (of this buffer's own
        folder), or None if no checkpoint was loaded (a buffer never
        checkpointed: everything is replayed).

    Returns:
      One `ToReplay` per writer with records above its mark, oldest writer
      first (by its first segment's time).
    """
    if not self.enabled:
      return []
    found = segments_lib.segments(self.folder)
    if not found:
      return []
    if manifest is not None and MARKS_KEY not in manifest.get('counts', {}):
      logging.warning(
          'The checkpoint loaded has no journal marks (written before '
          'journals, or without one): the %d journal(s) in %s are not '
          'replayed.', len(found), self.folder)
      return []
    marks = (manifest or {}).get('counts', {}).get(MARKS_KEY, {})
    todo = []
    for wid in sorted(found, key=lambda w: os.path.getmtime(found[w][0][1])):
      mark = marks.get(wid, {'mark': 0, 'keep_from': 1})
      contents = segments_lib.read(self.folder, wid)
      if all(r.kind == journaling.FLUSH for r in contents.records
             if r.seq > mark['mark']):  # Nothing after the mark to redo.
        self._replayed[wid] = contents.last_seq
        continue
      first = contents.records[0].seq if contents.records else None
      if first is None or first > mark['keep_from']:
        logging.error(
            'The journal of writer %s starts at record %s, but the loaded '
            'checkpoint needs it from record %d (its older records were '
            'dropped after a newer checkpoint, which is gone or damaged): '
            'records %d..%d are not replayed and are lost.', wid, first,
            mark['keep_from'], mark['mark'] + 1, contents.last_seq)
        self._replayed[wid] = contents.last_seq
        continue
      clear = journaling.last_clear(contents, mark['mark'])
      if clear is not None:  # Nothing before it is in the tables any more.
        todo.append(ToReplay(contents, clear, clear + 1, cleared=True))
      else:
        todo.append(ToReplay(contents, mark['mark'], mark['keep_from']))
    return todo

  def cleared(self, observers: Sequence[observer_lib.TrajectoryObserver]
              ) -> None:
    """The tables were emptied: each live observer's journal records it;
    the journals of closed and replayed writers, all of whose steps were in
    the tables, are deleted."""
    if not self.enabled:
      return
    live = set()
    for obs in observers:
      if obs.journal is not None and not obs.journal.closed:
        obs.journal_cleared()
        live.add(obs.journal.writer_id)
    for wid in segments_lib.segments(self.folder):
      if wid not in live:
        segments_lib.remove_writer(self.folder, wid)
        self._replayed.pop(wid, None)

  def replayed(self, item: ToReplay, records: int, items: int) -> None:
    """Records that `item` was replayed (`records` after its mark, making
    `items` items): the next checkpoint covers it."""
    self._replayed[item.contents.writer_id] = item.contents.last_seq
    self._replay_counts['writers'] += 1
    self._replay_counts['records'] += records
    self._replay_counts['items'] += items

  def stats(self, observers: Sequence[observer_lib.TrajectoryObserver]
            ) -> Optional[Dict[str, Any]]:
    """What the journals hold, for `stats()`; None if journals are off.

    Returns:
      `{'sync': the policy, 'writers': live journals, 'bytes': on disk,
      'records_since_checkpoint': records after the last committed
      checkpoint's marks, 'last_sync_unix': the newest sync (None before
      one), 'failures': failed writes or syncs, 'automatic_checkpoints':
      those the journals' bound took, 'replayed': {'writers', 'records',
      'items'} at the load}`.
    """
    if not self.enabled:
      return None
    journals = [obs.journal for obs in observers if obs.journal is not None]
    found = [j.stats() for j in journals]
    waiting = sum(
        j.next_seq - 1 - self._marks.get(j.writer_id, {}).get('mark', 0)
        for j in journals)
    syncs = [f['last_sync_unix'] for f in found if f['last_sync_unix']]
    on_disk = 0
    for paths in segments_lib.segments(self.folder).values():
      for _, path in paths:
        try:
          on_disk += os.lstat(path).st_size
        except FileNotFoundError:
          pass
    return {'sync': self._sync,
            'writers': sum(not j.closed for j in journals),
            'bytes': on_disk, 'records_since_checkpoint': waiting,
            'last_sync_unix': max(syncs) if syncs else None,
            'failures': sum(f['failures'] for f in found),
            'automatic_checkpoints': self.automatic_checkpoints,
            'replayed': dict(self._replay_counts)}
