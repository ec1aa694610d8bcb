"""What a `ReplayServer`'s control service answers.

Three methods (see `smart_replay.control.server`): 'info' describes the
buffer (configuration, checkpoint directory and checkpoints) and the serving
instance (`serving_record.describe_instance`), so that clients reconnecting
after a restart can count what they lost; 'checkpoint' writes a checkpoint;
'times_sampled' reads per-item sample counts. Nothing a request carries is
trusted: `client_extra` bounds and checks the metadata a client may store in
a manifest.
"""

import contextlib
import json
import os
import threading
import time
from typing import Any, Callable, ContextManager, Dict, Optional

from smart_replay.manager import facade as manager_lib
from smart_replay.control import server as control_server
from smart_replay.control import protocol
from smart_replay.server import checkpointer
from smart_replay.storage import checkpoint_folders
from smart_replay.storage import coordinated_records

# The largest `extra` a client may store in a manifest (its JSON).
MAX_EXTRA_BYTES = 64 << 10
# The most items `times_sampled` lists in one answer.
MAX_LISTED_ITEMS = 1_000_000


def client_extra(request: Dict[str, Any]) -> Dict[str, Any]:
  """The `extra` of a request, checked: a JSON object of at most
  `MAX_EXTRA_BYTES`, without the keys the server itself sets.

  Args:
    request: the request.

  Returns:
    A copy of it (empty without one).

  Raises:
    ValueError: naming what is wrong and what is allowed.
  """
  extra = request.get('extra')
  if extra is None:
    return {}
  if not isinstance(extra, dict):
    raise ValueError(f'extra must be a JSON object, got a '
                     f'{type(extra).__name__}.')
  try:
    size = len(json.dumps(extra, allow_nan=False))
  except (ValueError, RecursionError):
    raise ValueError('extra must be plain JSON: finite numbers, nested at '
                     'most a few hundred levels.') from None
  if size > MAX_EXTRA_BYTES:
    raise ValueError(f'extra must be at most {MAX_EXTRA_BYTES} bytes of '
                     f'JSON, got {size}.')
  reserved = {coordinated_records.EXTRA_KEY, coordinated_records.REQUESTED_KEY} & set(extra)
  if reserved:
    raise ValueError(f'extra must not set {sorted(reserved)}: the server '
                     'sets those keys itself.')
  return dict(extra)


def redact(value: Any, *, root: str) -> Any:
  """An answer without this machine's buffer path, process ids or host
  name, for callers nobody authenticated.

  Args:
    value: a JSON answer or an error message.
    root: the buffer directory, shown as '<buffer>'.

  Returns:
    The value with `root` (as given, and resolved) replaced in every string
    and the keys 'previous_pid' and 'previous_host' dropped.
  """
  if isinstance(value, str):
    for path in {os.path.realpath(root), root}:
      value = value.replace(path, '<buffer>')
    return value
  if isinstance(value, dict):
    return {k: redact(v, root=root) for k, v in value.items()
            if k not in ('previous_pid', 'previous_host')}
  if isinstance(value, list):
    return [redact(v, root=root) for v in value]
  return value


def control_handlers(served: Callable[[], manager_lib.ReplayBufferManager],
                     *, instance: Dict[str, Any],
                     checkpoint: Callable[..., str],
                     exclusive: Callable[[], ContextManager[Any]] =
                     contextlib.nullcontext
                     ) -> Dict[str, control_server.Handler]:
  """The control service's methods for a served buffer.

  Args:
    served: gives the served buffer's manager (a new one after a reload).
    instance: `serving_record.describe_instance()` of the serving instance
      (updated in
      place at a reload).
    checkpoint: writes a checkpoint a client asked for; called with the
      checked `extra=`.
    exclusive: held while `times_sampled` and `writer_marks` read their
      snapshot, so that no checkpoint runs meanwhile (a save tidies the
      folder the snapshot is read from).

  Returns:
    `{'info', 'checkpoint', 'times_sampled', 'writer_marks'}` handlers.
  """

  def info(request: Dict[str, Any]) -> Dict[str, Any]:
    del request
    manager = served()
    return {'config': manager.buffer_config,
            'checkpoint_dir': manager.checkpoint_dir,
            'keep_checkpoints': manager.keep_checkpoints,
            'checkpoints': list(manager.existing_checkpoints()),
            'instance': instance}

  def checkpoint_request(request: Dict[str, Any]) -> str:
    return checkpoint(extra=client_extra(request))

  def times_sampled(request: Dict[str, Any]) -> Dict[str, Any]:
    del request
    with exclusive():
      tables = served().stats(times_sampled=True)['tables']
    listed = sum(len(t['times_sampled']) for t in tables.values())
    if listed > MAX_LISTED_ITEMS:
      raise ValueError(
          f'times_sampled lists at most {MAX_LISTED_ITEMS:,} items over the '
          f'network; this buffer holds {listed:,}. Read them on the '
          "server's machine (smart_replay.tools.export of a checkpoint).")
    return {name: {str(key): n for key, n in t['times_sampled'].items()}
            for name, t in tables.items()}

  # The newest snapshot's items and when it began: a writer that asks what
  # the server holds now is answered from a snapshot that began after it
  # asked (one snapshot serves every writer that asked before it began).
  live = {'began': float('-inf'), 'items': {}}
  live_lock = threading.Lock()

  def writer_marks(request: Dict[str, Any]) -> Dict[str, Any]:
    writer_id = check_writer_id(request.get('writer_id'))
    if not request.get('live'):
      return {**newest_marks(served(), writer_id),
              'instance': instance.get('id')}
    above = request.get('above', 0)
    if isinstance(above, bool) or not isinstance(above, int) or above < 0:
      raise ValueError(f'above must be an integer >= 0, got {above!r}.')
    asked = time.monotonic()
    with live_lock:
      if live['began'] < asked:
        live['began'] = time.monotonic()
        with exclusive():
          live['items'] = served().writer_items()
      items = live['items']
    held = {table: {stream: [seq for seq in seqs if seq >= above]
                    for stream, seqs in writers.get(writer_id, {}).items()}
            for table, writers in items.items()}
    listed = sum(len(s) for t in held.values() for s in t.values())
    if listed > MAX_LISTED_ITEMS:
      raise ValueError(
          f'writer_marks lists at most {MAX_LISTED_ITEMS:,} items over the '
          f'network; writer {writer_id} has {listed:,} above {above}.')
    manager = served()
    return {**_marks_of(manager.loaded_checkpoint, manager.loaded_manifest,
                        writer_id), 'held': held,
            'instance': instance.get('id')}

  return {protocol.INFO: info, protocol.CHECKPOINT: checkpoint_request,
          protocol.TIMES_SAMPLED: times_sampled,
          protocol.WRITER_MARKS: writer_marks}


def check_writer_id(writer_id: Any) -> str:
  """Checks a writer id a client sent (16 lower-case hex digits).

  Raises:
    ValueError: naming the bad value.
  """
  if not isinstance(writer_id, str) or len(writer_id) != 16 or (
      writer_id.strip('0123456789abcdef')):
    raise ValueError(f'writer_id must be 16 lower-case hex digits, got '
                     f'{writer_id!r}.')
  return writer_id


def newest_marks(manager: manager_lib.ReplayBufferManager,
                 writer_id: str) -> Dict[str, Any]:
  """One writer's marks in the served buffer's newest checkpoint: how far
  each table holds what each of its streams wrote.

  Args:
    manager: the served buffer's manager.
    writer_id: the writer's id (`TrajectoryObserver.writer_id`, 16 hex
      digits).

  Returns:
    `_marks_of` the newest checkpoint.

  Raises:
    ValueError: if `writer_id` is not 16 lower-case hex digits.
  """
  check_writer_id(writer_id)
  existing = list(manager.existing_checkpoints())
  if not existing:
    return _marks_of(None, None, writer_id)
  return _marks_of(existing[-1],
                   checkpoint_folders.read_manifest(existing[-1]), writer_id)


def _marks_of(path: Optional[str], manifest: Optional[Dict[str, Any]],
              writer_id: str) -> Dict[str, Any]:
  """`{'checkpoint': path or None, 'number': its N or None, 'marks':
  {table: {stream: [seq, items]}} (tables holding none of the writer's
  items map to {}), or None if the checkpoint records no marks (or there
  is none)}` (see `storage.writer_marks`)."""
  stored = (manifest or {}).get('counts', {}).get(
      checkpointer.WRITER_MARKS_KEY)
  return {'checkpoint': path,
          'number': path and checkpoint_folders.checkpoint_number(path),
          'marks': None if stored is None else {
              table: writers.get(writer_id, {})
              for table, writers in stored.items()}}
