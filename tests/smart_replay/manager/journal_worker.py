"""Processes the journal tests kill: a manager that writes, flushes and now
and then checkpoints, with a write-ahead journal.

Like `durability_worker` (whose deterministic rounds it writes: round r's
steps have observations r * 10 .. r * 10 + 9), children start from a
forkserver that has loaded TensorFlow, Reverb and smart_replay once.
"""

import os
import signal
import time

from smart_replay.storage import journal_segments
from smart_replay.writing import journaling
from tests.smart_replay.storage import durability_worker as rounds

STEPS = journal_segments.JOURNAL_STEPS + ('replayed',)


def make_manager(buffer_dir, sync='always'):
  """The manager every process of a journal test builds."""
  return rounds.make_manager(buffer_dir, journal=sync)


def _die_at(step, occurrence, conn):
  """Kills this process at the `occurrence`-th time it reaches `step`."""
  seen = [0]

  def fault_point(reached):
    if reached != step:
      return
    seen[0] += 1
    if seen[0] == occurrence:
      conn.send(('dying', step))
      os.kill(os.getpid(), signal.SIGKILL)
  if step == 'replayed':
    journaling._fault_point = fault_point  # pylint: disable=protected-access
  else:
    journal_segments.fault_point = fault_point


def write_until_killed(buffer_dir, step, occurrence, conn):
  """Loads the buffer (replaying its journals) and reports what it holds
  (`('loaded', first steps of its items)`); then writes the rounds after
  the newest it holds, flushing each and checkpointing every second one,
  reporting ('flushed', r) and ('committed', r); dies at `step`'s
  `occurrence`-th time (or when killed)."""
  _die_at(step, occurrence, conn)
  manager = make_manager(buffer_dir)
  _, observer = manager.load_replay_buffer()
  stored = rounds.stored_first_steps(manager)
  conn.send(('loaded', stored))
  round_index = int(max(stored)) // rounds.STEPS_PER_ROUND + 1
  while True:
    rounds.write_round(observer, round_index)
    conn.send(('flushed', round_index))
    if round_index % 2:
      manager.checkpoint(extra={'round': round_index})
      conn.send(('committed', round_index))
    round_index += 1


def write_without_flushing(buffer_dir, conn):
  """Loads the buffer with the default journal ('every_second') and writes
  rounds without ever flushing, reporting `('written', r, time.monotonic())`
  as each round's last step is written; runs until killed."""
  manager = make_manager(buffer_dir, sync='every_second')
  _, observer = manager.load_replay_buffer()
  round_index = 1
  while True:
    for step in rounds.round_steps(round_index):
      observer(step)
    conn.send(('written', round_index, time.monotonic()))
    round_index += 1
