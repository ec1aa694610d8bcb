"""What a `ReplayServer`'s control service answers.

Three methods (see `smart_replay.server.control`): 'info' describes the
buffer (configuration, checkpoint directory and checkpoints) and the serving
instance, so that clients reconnecting after a restart can count what they
lost; 'checkpoint' writes a checkpoint; 'times_sampled' reads per-item sample
counts.
"""

import datetime
import time
import uuid
from typing import Any, Callable, Dict, Optional

from smart_replay.manager import facade as manager_lib
from smart_replay.server import control as control_lib


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
                      restart_loss: Optional[Dict[str, Any]]
                      ) -> Dict[str, Any]:
  """Who a serving process is, for clients that reconnect after a restart.

  Items a client had confirmed after the restored save began are lost.

  Args:
    restored_checkpoint: the checkpoint this process resumed, or None.
    restored_manifest: its manifest, or None.
    restart_loss: `serving_record.lost_since` at start-up, or None.

  Returns:
    `{'id', 'started_unix', 'restored_checkpoint', 'restored_save_started',
    'restart_loss'}` with a fresh random id.
  """
  return {'id': uuid.uuid4().hex, 'started_unix': time.time(),
          'restored_checkpoint': restored_checkpoint,
          'restored_save_started': _save_started(
              restored_manifest if restored_checkpoint else None),
          'restart_loss': restart_loss}


def control_handlers(served: Callable[[], manager_lib.ReplayBufferManager],
                     *, instance: Dict[str, Any],
                     checkpoint: Callable[..., str]
                     ) -> Dict[str, control_lib.Handler]:
  """The control service's methods for a served buffer.

  Args:
    served: gives the served buffer's manager (a new one after a reload).
    instance: `describe_instance()` of the serving instance (updated in
      place at a reload).
    checkpoint: writes a checkpoint; called with `extra=` and `reason=`.

  Returns:
    `{'info', 'checkpoint', 'times_sampled'}` handlers.
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
    return checkpoint(extra=request.get('extra'), reason='a client asked')

  def times_sampled(request: Dict[str, Any]) -> Dict[str, Any]:
    del request
    tables = served().stats(times_sampled=True)['tables']
    return {name: {str(key): n for key, n in t['times_sampled'].items()}
            for name, t in tables.items()}

  return {'info': info, 'checkpoint': checkpoint_request,
          'times_sampled': times_sampled}
