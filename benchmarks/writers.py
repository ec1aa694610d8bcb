"""Insert speed: the compared writers, timed over the same steps.

* stock: TF-Agents' `ReverbAddTrajectoryObserver` (one column per field);
* ours: our `TrajectoryObserver` in the packed layout, single environment
  and batched; ours_columns: the same with one column per field; blocks:
  packed items of `workload.BLOCK_LENGTH` steps;
* reverb_floor: Reverb's C++ writer calls alone, appending steps packed
  beforehand, from a minimal Python loop;
* ours_journal, ours_journal_always: ours (packed) with a write-ahead journal
  synced every second (the default) and at every flush, ours_resend keeping
  what it sent in memory (as a client observer does, to send it again after
  a server restart), and ours_no_journal with neither, all four into the
  same server ('sink'), side by side in turns of 100 steps
  (`write_interleaved`); `replay_journal` times replaying one of those
  journals into a fresh observer.
"""

import functools
import os
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from absl import logging
import reverb
from tf_agents.replay_buffers import reverb_utils
import tree

from smart_replay import _reverb_internal as reverb_internal
from smart_replay.config import options
from smart_replay.storage import journal as journal_lib
from smart_replay.storage import journal_segments
from smart_replay.writing import chunking
from smart_replay.manager import sent_records
from smart_replay.writing import journaling
from smart_replay.writing import observer as observer_lib
from smart_replay_benchmarks import servers as servers_lib
from smart_replay_benchmarks import workload as workload_lib


# The journal sides, written side by side (`write_interleaved`): name,
# `write_ours`'s `journal_sync`.
JOURNAL_SIDES = {'ours_no_journal': None, 'ours_journal': 'every_second',
                 'ours_journal_always': 'always', 'ours_resend': 'memory'}


def _write_all(observer, steps) -> float:
  """Calls `observer` on every step, then flushes; returns the seconds."""
  start = time.perf_counter()
  try:
    for step in steps:
      observer(step)
    observer.flush()
    return time.perf_counter() - start
  finally:
    observer.close()


def write_stock(client: reverb.Client, steps) -> float:
  """Writes `steps` through TF-Agents' `ReverbAddTrajectoryObserver`.

  Its waits have no timeout (that is the stock behaviour); the table never
  blocks inserts here.

  Args:
    client: a client of the stock buffer's server.
    steps: the steps.

  Returns:
    The seconds it took, flush included.
  """
  return _write_all(reverb_utils.ReverbAddTrajectoryObserver(
      client, workload_lib.TABLE,
      sequence_length=workload_lib.SEQUENCE_LENGTH, stride_length=1), steps)


def write_ours(client: reverb.Client, spec, steps, *,
               buffer: workload_lib.Buffer, num_envs=None,
               chunk_length=None, journal_sync: Optional[str] = None,
               journal_dir: Optional[str] = None) -> float:
  """Writes `steps` through our `TrajectoryObserver`.

  Args:
    client: a client of the buffer's server.
    spec: the step spec.
    steps: the steps (batched over `num_envs` if given).
    buffer: how the buffer stores them (layout, packed items).
    num_envs: environments per step, or None.
    chunk_length: the observer's chunk length (None: automatic).
    journal_sync: with a write-ahead journal synced so ('always',
      'every_second', 'off'); 'memory': keeping what it sent in memory, as
      a client observer does to send it again after a server restart
      (`storage.retained`, `WriteOptions.resend_bytes`); None: none.
    journal_dir: the journal's folder (made; required with `journal_sync`).

  Returns:
    The seconds it took, flush (and the journal's last sync) included.
  """
  return _write_all(_our_observer(
      client, spec, buffer=buffer, num_envs=num_envs,
      chunk_length=chunk_length, journal_sync=journal_sync,
      journal_dir=journal_dir), steps)


def write_interleaved(client: reverb.Client, spec, steps, *,
                      buffer: workload_lib.Buffer, chunk_length=None,
                      sides: Dict[str, Optional[str]], journal_dir: str,
                      steps_per_turn: int = 100) -> Dict[str, float]:
  """Writes `steps` through one observer per side, taking turns.

  Every observer is made first; then each writes the next
  `steps_per_turn` steps in turn (the order rotating and reversing from
  turn to turn), so a change of the machine's load falls on every side
  alike: side-by-side ratios to a few percent where whole runs in turn
  differ by 10% between two identical sides on a busy 2-core machine.

  Args:
    client: a client of the server they all write to.
    spec: the step spec.
    steps: the steps each side writes.
    buffer: how the buffer stores them.
    chunk_length: the observers' chunk length (None: automatic).
    sides: `{name: journal_sync}` as `write_ours` takes it.
    journal_dir: a folder for their journals (one folder each, `name`).
    steps_per_turn: steps a side writes per turn.

  Returns:
    `{name: seconds}`: its turns and its final flush.
  """
  names = list(sides)
  os.makedirs(journal_dir, exist_ok=True)
  observers = {name: _our_observer(
      client, spec, buffer=buffer, chunk_length=chunk_length,
      journal_sync=sync, journal_dir=os.path.join(journal_dir, name))
               for name, sync in sides.items()}
  seconds = dict.fromkeys(names, 0.0)
  try:
    for turn, start in enumerate(range(0, len(steps), steps_per_turn)):
      part = steps[start:start + steps_per_turn]
      order = names[turn % len(names):] + names[:turn % len(names)]
      for name in order if turn % 2 == 0 else order[::-1]:
        observer, began = observers[name], time.perf_counter()
        for step in part:
          observer(step)
        seconds[name] += time.perf_counter() - began
    for name in names:
      began = time.perf_counter()
      observers[name].flush()
      seconds[name] += time.perf_counter() - began
  finally:
    for observer in observers.values():
      observer.close()
  return seconds


def _our_observer(client: reverb.Client, spec, *, buffer, num_envs=None,
                  chunk_length=None, journal_sync=None, journal_dir=None):
  """Our observer as `write_ours` describes it."""
  layout, table = buffer.step_layout(spec), buffer.table(1)
  if journal_sync == 'memory':  # What a client manager gives an observer.
    journal, _ = sent_records.SentRecords(options.WriteOptions(), None).new(
        usable=True, layout=layout, data_spec=spec, num_envs=num_envs,
        tables=[table.name])
  else:
    journal = journal_sync and journal_lib.JournalWriter(
        journal_dir, writer_id='b0', sync=journal_sync,
        meta=journaling.journal_meta(layout, spec, num_envs=num_envs,
                                     tables=[table.name]))
  return observer_lib.TrajectoryObserver(
      client, tables=[table], data_spec=spec, layout=layout,
      num_envs=num_envs, journal=journal or None,
      keeps_sent=journal_sync == 'memory',
      writes=options.WriteOptions(chunk_length=chunk_length))


def replay_journal(client: reverb.Client, spec, journal_dir: str, *,
                   buffer: workload_lib.Buffer) -> Dict[str, float]:
  """Reads a journal `write_ours` wrote and replays it into a fresh observer.

  Args:
    client: a client of the server to replay into.
    spec: the step spec.
    journal_dir: the journal's folder.
    buffer: how the buffer stores the steps.

  Returns:
    `{'seconds', 'steps', 'bytes'}`: reading and replaying it whole, the
    steps it held and its size on disk.
  """
  start = time.perf_counter()
  contents = journal_segments.read(journal_dir, 'b0')
  observer = observer_lib.TrajectoryObserver(
      client, tables=[buffer.table(1)], data_spec=spec,
      layout=buffer.step_layout(spec))
  try:
    done = observer.replay_journal(contents, mark=0, keep_from=1)
  finally:
    observer.close()
  return {'seconds': time.perf_counter() - start, 'steps': done.counted[0],
          'bytes': contents.bytes}


def _write_reverb_floor(client: reverb.Client, spec, steps, *,
                        chunk_length=None) -> float:
  """Writes `steps` with Reverb's C++ writer calls alone; returns seconds.

  The same chunks and items as our observer in the packed layout, created
  the same way (a chunk's items once it is complete), from a minimal Python
  loop with no validation, bookkeeping or back-pressure, appending rows
  packed before the clock starts: the speed limit of Reverb's
  `TrajectoryWriter` on this machine.
  """
  layout = workload_lib.BUFFERS['sink'].step_layout(spec)
  rows = [layout.columns(tree.flatten(step)) for step in steps]
  length = chunk_length or chunking.auto_chunk_length(layout.step_spec)
  writer = reverb_internal.new_trajectory_writer(
      client, chunk_length=length,
      keep_alive=length + workload_lib.SEQUENCE_LENGTH)
  append, create_item = reverb_internal.raw_calls(writer)
  squeeze = [False] * layout.num_columns
  start = time.perf_counter()
  try:
    previous, items, in_chunk = None, [], 0
    for step, row in zip(steps, rows):
      refs = append(row)
      in_chunk += 1
      if previous is not None:
        items.append([[a, b] for a, b in zip(previous, refs)])
      previous = refs
      if in_chunk == length or step.step_type == 2:
        for columns in items:
          create_item(workload_lib.TABLE, 1.0, columns, squeeze)
        items, in_chunk = [], 0
      if step.step_type == 2:
        writer.end_episode(timeout_ms=600_000)
        previous = None
    for columns in items:
      create_item(workload_lib.TABLE, 1.0, columns, squeeze)
    writer.flush(timeout_ms=600_000)
    return time.perf_counter() - start
  finally:
    writer.close()


def measure_inserts(workload: workload_lib.Workload, spec: Any,
                    servers: Dict[str, servers_lib.ServerProcess]
                    ) -> Tuple[Dict[str, List[float]], Dict[str, float]]:
  """Steps/s of every writer, one value per repeat, in alternating order.

  Each repeat writes its share of the steps through every path: the stock
  observer into the 'stock' server, ours into 'ours' (packed),
  'ours_columns' and 'blocks', and our batched observer and the Reverb floor
  into 'sink'.

  Args:
    workload: what to write.
    spec: the step spec.
    servers: the servers by `workload.BUFFERS` name.

  Returns:
    `({'stock', 'ours', 'ours_columns', 'blocks', 'ours_batched',
    'reverb_floor', 'ours_no_journal', 'ours_journal',
    'ours_journal_always', 'ours_resend': steps/s per repeat},
    replay_journal's figures for
    the last repeat's default journal)`.
  """
  per_repeat = workload.steps_per_repeat
  chunk_length, num_envs = workload.chunk_length, workload.num_envs
  clients = {name: server.client for name, server in servers.items()}
  buffers = workload_lib.BUFFERS
  inserts = {'stock': [], 'ours': [], 'ours_columns': [], 'blocks': [],
             'ours_batched': [], 'reverb_floor': [], 'ours_no_journal': [],
             'ours_journal': [], 'ours_journal_always': [],
             'ours_resend': []}
  journals = tempfile.mkdtemp(prefix='journals-')
  started = time.monotonic()
  for repeat in range(workload.repeats):
    steps = workload_lib.make_steps(workload, repeat * per_repeat, per_repeat)
    batched = workload_lib.make_steps(workload, repeat * per_repeat,
                                      per_repeat // num_envs, num_envs)
    # (name, env-steps written, writer); 'sink' takes batched and floor writes.
    jobs = [
        ('stock', len(steps),
         functools.partial(write_stock, clients['stock'], steps)),
        ('ours_batched', len(batched) * num_envs,
         functools.partial(write_ours, clients['sink'], spec, batched,
                           buffer=buffers['sink'], num_envs=num_envs,
                           chunk_length=chunk_length)),
        ('reverb_floor', len(steps),
         functools.partial(_write_reverb_floor, clients['sink'], spec, steps,
                           chunk_length=chunk_length)),
    ] + [(name, len(steps),
          functools.partial(write_ours, clients[name], spec, steps,
                            buffer=buffers[name], chunk_length=chunk_length))
         for name in ('ours', 'ours_columns', 'blocks')] + [
             ('journal sides', len(steps), functools.partial(
                 write_interleaved, clients['sink'], spec, steps,
                 buffer=buffers['ours'], chunk_length=chunk_length,
                 sides=JOURNAL_SIDES,
                 journal_dir=os.path.join(journals, str(repeat))))]
    for name, count, write in jobs if repeat % 2 == 0 else jobs[::-1]:
      if name == 'journal sides':  # Side by side, in turns of 100 steps.
        for side, seconds in write().items():
          inserts[side].append(count / seconds)
      else:
        inserts[name].append(count / write())  # Alternating the order.
    elapsed = time.monotonic() - started
    logging.info(
        'insert repeat %d/%d: %s steps/s; ETA %.0f s', repeat + 1,
        workload.repeats,
        ', '.join(f'{n} {r[-1]:,.0f}' for n, r in inserts.items()),
        elapsed / (repeat + 1) * (workload.repeats - repeat - 1))
  last = os.path.join(journals, str(workload.repeats - 1), 'ours_journal')
  replayed = replay_journal(clients['sink'], spec, last,
                            buffer=buffers['ours'])
  shutil.rmtree(journals, ignore_errors=True)
  return inserts, replayed
