"""What a serving process last reported, to count what a crash lost.

A server killed without its final checkpoint loses every item inserted after
its last checkpoint. Reverb cannot say how many: the restored table counts
only what the checkpoint held. So `ReplayServer` keeps `<buffer>/.serving.json`
up to date while it serves (its pid, the time and the tables' total insert
counter, rewritten atomically at most once per poll, when inserts happened)
and marks it clean after its final checkpoint. The next start reads it: if the
previous server did not stop cleanly, the items it inserted after the restored
checkpoint are lost, and `lost_since` counts them from the two insert counters
(Reverb restores the counter with the checkpoint, so they are comparable). The
count is a lower bound: inserts in the last poll interval before the crash
may be missing from the record.
"""

import datetime
import json
import os
import socket
import time
import uuid
from typing import Any, Callable, Dict, Optional

from absl import logging

from smart_replay import errors

RECORD_FILE = '.serving.json'


def write(directory: str, *, inserts: int, clean: bool) -> None:
  """Records the serving state of the buffer in `directory` (atomic rename).

  Args:
    directory: the buffer directory.
    inserts: the tables' total insert counter now.
    clean: True once the server stopped after its final checkpoint.

  Raises:
    OSError: if the file cannot be written (e.g. a full disk).
  """
  record = {'pid': os.getpid(), 'host': socket.gethostname(),
            'time': datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec='seconds'),
            'inserts': int(inserts), 'clean': bool(clean)}
  path = os.path.join(directory, RECORD_FILE)
  with open(path + '.tmp', 'w') as f:
    json.dump(record, f)
  os.replace(path + '.tmp', path)


class Recorder:
  """Keeps the record of one serving process up to date.

  Args:
    directory: the buffer directory.
  """

  def __init__(self, directory: str):
    self.directory = directory
    self.inserts = None  # The insert counter recorded last.

  def update(self, inserts: int, *, clean: bool = False) -> None:
    """Records `inserts` if it changed (or `clean`); a failure is logged:
    serving goes on.

    Args:
      inserts: the tables' total insert counter now.
      clean: the server stopped after a final checkpoint holding them all.
    """
    if inserts == self.inserts and not clean:
      return
    try:
      write(self.directory, inserts=inserts, clean=clean)
      self.inserts = inserts
    except OSError as e:
      logging.warning('Could not update %s (%s); a crash now would be '
                      'counted short.', RECORD_FILE, e)

  def stopped(self, read_inserts: Callable[[], int], *,
              saved: Optional[int]) -> None:
    """Records the final insert counter: clean if the last checkpoint holds
    every insert (else the next start counts what is lost).

    Args:
      read_inserts: reads the tables' total insert counter.
      saved: the insert counter the last checkpoint holds (None: none).
    """
    try:
      inserts = read_inserts()
    except errors.SmartReplayError as e:
      logging.warning('Could not read the final insert count: %s', e)
      return
    self.update(inserts, clean=saved is not None and inserts == saved)


def reloaded(*, inserts: int, restored_inserts: int,
             checkpoint: str) -> Dict[str, Any]:
  """What restoring an older checkpoint in place drops, as `lost_since`
  reports a crash's loss.

  Args:
    inserts: the total insert counter before the restore.
    restored_inserts: the one the restored checkpoint holds.
    checkpoint: the restored checkpoint.

  Returns:
    `{'lost_items', 'cause': 'restore', 'checkpoint', 'previous_pid',
    'previous_host', 'last_seen'}`.
  """
  return {'lost_items': max(0, int(inserts) - int(restored_inserts)),
          'cause': 'restore',
          'checkpoint': checkpoint, 'previous_pid': os.getpid(),
          'previous_host': socket.gethostname(),
          'last_seen': datetime.datetime.now(datetime.timezone.utc).isoformat(
              timespec='seconds')}


def read(directory: str) -> Optional[Dict[str, Any]]:
  """The record of the previous serving process, or None if there is none.

  Args:
    directory: the buffer directory.

  Returns:
    The dict `write` stored, or None if the file is missing or unreadable.
  """
  try:
    with open(os.path.join(directory, RECORD_FILE)) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  return record if isinstance(record, dict) and 'inserts' in record else None


def lost_since(previous: Optional[Dict[str, Any]], *, checkpoint: str,
               restored_inserts: int) -> Optional[Dict[str, Any]]:
  """What a previous server that did not stop cleanly lost, if anything.

  Args:
    previous: `read()` before this start, or None.
    checkpoint: the checkpoint this start restored.
    restored_inserts: the total insert counter that checkpoint holds.

  Returns:
    None after a clean stop (or with no record); else `{'lost_items': n,
    'cause': 'crash', 'checkpoint': ..., 'previous_pid': ...,
    'previous_host': ..., 'last_seen': ...}`, where `lost_items` (>= 0) is a
    lower bound on the items inserted after `checkpoint` that the crash
    lost.
  """
  if not previous or previous.get('clean'):
    return None
  return {'lost_items': max(0, int(previous['inserts']) - restored_inserts),
          'cause': 'crash',
          'checkpoint': checkpoint, 'previous_pid': previous.get('pid'),
          'previous_host': previous.get('host'),
          'last_seen': previous.get('time')}


def _save_started(manifest: Optional[Dict[str, Any]]) -> Optional[float]:
  """When the save of a checkpoint began (wall time), or None without one;
  manifests of older versions give their creation time instead."""
  if not manifest:
    return None
  started = manifest['counts'].get('save_started_unix')
  if started is None:
    started = datetime.datetime.fromisoformat(
        manifest['created_utc']).timestamp()
  return started


def describe_instance(*, restored_checkpoint: Optional[str],
                      restored_manifest: Optional[Dict[str, Any]],
                      restart_loss: Optional[Dict[str, Any]],
                      on_request: bool = False) -> Dict[str, Any]:
  """Who a serving process is, for clients that reconnect after a restart.

  Items a client had confirmed after the restored save began are lost;
  after a restart, client observers that keep what they sent send it
  again, but not after a restore someone asked for (`on_request`: the
  buffer is to be as that checkpoint was).

  Args:
    restored_checkpoint: the checkpoint this process resumed, or None.
    restored_manifest: its manifest, or None.
    restart_loss: `serving_record.lost_since` at start-up, or None.
    on_request: the restore was asked for (a reload), not a restart.

  Returns:
    `{'id', 'started_unix', 'restored_checkpoint', 'restored_save_started',
    'restart_loss', 'restored_on_request'}` with a fresh random id.
  """
  return {'id': uuid.uuid4().hex, 'started_unix': time.time(),
          'restored_checkpoint': restored_checkpoint,
          'restored_save_started': _save_started(
              restored_manifest if restored_checkpoint else None),
          'restart_loss': restart_loss, 'restored_on_request': on_request}


def log_restart_loss(loss: Optional[Dict[str, Any]],
                     checkpoint: Optional[str]) -> None:
  """Logs what the previous server lost by stopping without a final checkpoint.

  Args:
    loss: `lost_since()` at this start, or None (nothing is logged).
    checkpoint: the checkpoint this start restored, or None.
  """
  if loss and not loss['lost_items']:
    logging.info('The previous server of this buffer stopped without its '
                 'final checkpoint; %s holds every insert it recorded.',
                 checkpoint)
  elif loss:
    logging.warning(
        'The previous server of this buffer (pid %s on %s, last seen %s) '
        'stopped without its final checkpoint: at least %d item(s) it '
        'inserted after %s were lost. Writers that were connected count '
        'theirs in lost_items.', loss['previous_pid'], loss['previous_host'],
        loss['last_seen'], loss['lost_items'],
        checkpoint or 'its start (it had no checkpoint)')
