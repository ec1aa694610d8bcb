"""Checkpoint and restore: seconds and bytes of each buffer's save."""

import concurrent.futures
import os
import time
from typing import Any, Dict

from absl import logging
import reverb

from smart_replay.config import buffer as config_lib
from smart_replay.server import checkpointer as checkpointer_lib
from smart_replay.server import local_server as server_lib
from smart_replay.storage import checkpoint_folders
from smart_replay.storage import store as checkpoint_store
from smart_replay_benchmarks import servers as servers_lib
from smart_replay_benchmarks import workload as workload_lib

_CHECKPOINT_TIMEOUT_S = 1800.0


def _folder_bytes(path: str) -> int:
  """Bytes of the files in the folder `path`."""
  return sum(os.path.getsize(os.path.join(path, name))
             for name in os.listdir(path))


def _reverb_checkpoint(client: reverb.Client, name: str) -> str:
  """Reverb's save of a buffer, bounded by `_CHECKPOINT_TIMEOUT_S`.

  Args:
    client: a client of the buffer's server.
    name: the buffer's name, for the timeout's message.

  Returns:
    The folder Reverb wrote.

  Raises:
    TimeoutError: if the save takes longer than `_CHECKPOINT_TIMEOUT_S`.
  """
  pool = concurrent.futures.ThreadPoolExecutor(1)
  try:
    return server_lib.wait_for_checkpoint(
        pool.submit(client.checkpoint), timeout_s=_CHECKPOINT_TIMEOUT_S,
        where=f'the {name} buffer\'s server')
  finally:
    pool.shutdown(wait=False)  # A timed-out save must not block here.


def _checkpoint_like_the_manager(client: reverb.Client, spec: Any,
                                 capacity: int, root: str,
                                 buffer: workload_lib.Buffer) -> str:
  """A save as `ReplayBufferManager.checkpoint()` makes it.

  Reverb's save, bounded and checked for every table's items, then moved to
  a numbered checkpoint with every file fingerprinted and the manifest.

  Args:
    client: a client of the buffer's server.
    spec: the step spec.
    capacity: the table's max_size.
    root: the checkpoint store's root (on the file system of the server's
      Reverb checkpoints).
    buffer: how the buffer stores the stream (recorded in the manifest).

  Returns:
    The committed checkpoint folder.
  """
  config = config_lib.BufferConfig.resolve(
      data_spec=spec, capacity=capacity,
      sequence_length=workload_lib.SEQUENCE_LENGTH, stride_length=1,
      table_configs=[buffer.table(capacity)],
      layout=buffer.layout, frame_stack=False).to_manifest()  # As written.
  checkpointer = checkpointer_lib.Checkpointer(
      client, checkpoint_store.CheckpointStore(root),
      timeout_s=_CHECKPOINT_TIMEOUT_S)
  try:
    return checkpointer.save(config, {'env_steps': 0, 'episodes': 0})
  finally:
    checkpointer.close()


def measure_checkpoints(spec: Any, capacity: int, items: Dict[str, int],
                        servers: Dict[str, servers_lib.ServerProcess],
                        work: str) -> Dict[str, Dict[str, Any]]:
  """Checkpoints and restores the 'stock', 'ours' and 'blocks' buffers.

  A checkpoint is timed from the save request to its last file: Reverb's
  save for stock, the manager's `Checkpointer.save` for ours (Reverb's save
  checked, a numbered checkpoint, every file fingerprinted, the manifest). A restore
  is timed from a fresh server process to its serving the restored table,
  plus, for ours, the verification of every file the manager makes before
  loading.

  Args:
    spec: the step spec.
    capacity: the tables' max_size.
    items: the items of each buffer, by name.
    servers: the running servers; 'stock', 'ours' and 'blocks' are saved,
      then stopped and removed from it.
    work: the folder of the checkpoint roots.

  Returns:
    {'stock', 'ours', 'blocks': {path, seconds, bytes, items,
    restore_seconds, restored_items}}.
  """
  checkpoints = {}
  for name in ('stock', 'ours', 'blocks'):
    buffer = workload_lib.BUFFERS[name]
    start = time.perf_counter()
    if name != 'stock':
      path = _checkpoint_like_the_manager(
          servers[name].client, spec, capacity,
          os.path.join(work, f'{name}_buffer'), buffer)
    else:
      path = _reverb_checkpoint(servers[name].client, name)
    checkpoint = {'path': path, 'seconds': time.perf_counter() - start,
                  'bytes': _folder_bytes(path), 'items': items[name]}
    servers.pop(name).close()
    start = time.perf_counter()
    if name != 'stock':  # The manager verifies every file before loading.
      checkpoint_folders.verify(path)
    verify_seconds = time.perf_counter() - start
    with servers_lib.ServerProcess(
        spec, capacity, os.path.join(work, f'{name}_restored'),
        fallback=path, buffer=buffer) as restored:
      checkpoint['restore_seconds'] = restored.load_seconds + verify_seconds
      checkpoint['restored_items'] = restored.items()
    checkpoints[name] = checkpoint
    logging.info('checkpoint of the %s buffer: %.2f s, %.1f MB, restore '
                 '%.2f s', name, checkpoint['seconds'],
                 checkpoint['bytes'] / 1e6, checkpoint['restore_seconds'])
  return checkpoints
