"""Agent and replay buffer checkpoints taken together, restored as a pair.

A training run must resume with an agent and a buffer from the same moment:
an agent ahead of its buffer has trained on experience the buffer no longer
has; one behind it retrains on experience it already used. `PairedCheckpointer`
saves both at the same train step (buffer first, its manifest recording the
step, then the agent as `ckpt-<step>`), and `find_pairs` / `restore_pair` pick
the newest step present on both sides, saying so when either side has a newer
checkpoint that cannot be used.
"""

import os
import re
from typing import Any, Dict, List, NamedTuple, Optional

from absl import logging
import gin
import tensorflow as tf
from tf_agents.train import interval_trigger

from smart_replay import errors
from smart_replay.manager import facade as manager_lib
from smart_replay.storage import coordinated_records
from smart_replay.storage import durable
from smart_replay.storage import checkpoint_folders as checkpoints_lib
from smart_replay.storage import manifest as manifest_lib
from smart_replay.utils import checks

_AGENT_CKPT = re.compile(r'^ckpt-(\d+)$')


class Pair(NamedTuple):
  """A buffer checkpoint and an agent checkpoint of the same train step."""
  train_step: int
  buffer_checkpoint: str
  agent_checkpoint: str


def agent_checkpoints(directory: str) -> Dict[int, str]:
  """Lists the agent checkpoints in `directory`.

  Args:
    directory: a `tf.train.CheckpointManager` directory.

  Returns:
    `{train_step: checkpoint_prefix}`.
  """
  state = tf.train.get_checkpoint_state(directory)
  found = {}
  for path in (state.all_model_checkpoint_paths if state else []):
    match = _AGENT_CKPT.match(os.path.basename(path))
    if match and tf.io.gfile.exists(path + '.index'):
      found[int(match.group(1))] = path
  return found


def buffer_checkpoints(buffer_dir: str) -> Dict[int, str]:
  """Lists the buffer checkpoints in `buffer_dir` that record a train step.

  Args:
    buffer_dir: a buffer directory.

  Returns:
    `{train_step: checkpoint_folder}` (newest folder for a repeated step).
  """
  found = {}
  try:
    folders = checkpoints_lib.find_checkpoints(buffer_dir)
  except errors.CheckpointNotFoundError:
    return found
  for folder in reversed(folders):  # Oldest first: newer ones win.
    try:
      stored = manifest_lib.read(os.path.join(folder,
                                              manifest_lib.MANIFEST_NAME))
    except (OSError, ValueError):
      continue
    extra = stored.get('extra') or {}
    if extra.get(coordinated_records.AUTOMATIC_KEY):
      continue  # It carries the step of the checkpoint before it.
    step = extra.get('train_step')
    if isinstance(step, int):
      found[step] = folder
  return found


def find_pairs(buffer_dir: str, agent_dir: str) -> List[Pair]:
  """Lists the train steps checkpointed on both sides, newest first.

  Args:
    buffer_dir: the run's buffer directory.
    agent_dir: the run's agent checkpoint directory.

  Returns:
    `Pair`s, newest first.
  """
  buffers = buffer_checkpoints(buffer_dir)
  agents = agent_checkpoints(agent_dir)
  return [Pair(step, buffers[step], agents[step])
          for step in sorted(set(buffers) & set(agents), reverse=True)]


def set_aside_newer_than(pair: Pair, buffer_dir: str, agent_dir: str) -> None:
  """Moves checkpoints newer than `pair` (without a partner) out of the way.

  Left in place they would take the buffer's keep slots, or pair up later
  with a checkpoint of a different history. They go to `orphaned/` beside
  the buffer's checkpoints (which keeps the newest entries, see
  `durable.set_aside`) and the agent's.

  Args:
    pair: the pair a run resumes from.
    buffer_dir: the run's buffer directory.
    agent_dir: the run's agent checkpoint directory.
  """
  for step, folder in buffer_checkpoints(buffer_dir).items():
    if step > pair.train_step:
      durable.set_aside(buffer_dir, folder, reason=(
          f'an unpaired buffer checkpoint (train step {step}, newer than the '
          f'pair resumed from, {pair.train_step})'))
  for step, prefix in agent_checkpoints(agent_dir).items():
    if step > pair.train_step:
      aside = os.path.join(agent_dir, checkpoints_lib.ORPHANED_DIR)
      os.makedirs(aside, exist_ok=True)
      for path in tf.io.gfile.glob(prefix + '.*'):
        os.replace(path, os.path.join(aside, os.path.basename(path)))
      logging.warning('Moved unpaired agent checkpoint %s (step %d) to %s.',
                      prefix, step, aside)


def newest_pair(buffer_dir: str, agent_dir: str) -> Optional[Pair]:
  """Returns the newest `Pair`, warning about unusable newer checkpoints.

  Args:
    buffer_dir: the run's buffer directory.
    agent_dir: the run's agent checkpoint directory.

  Returns:
    The newest pair, or None if neither side has any checkpoint.

  Raises:
    CheckpointNotFoundError: if checkpoints exist but no step is on both
      sides; the message lists the steps of each side.
  """
  buffers = buffer_checkpoints(buffer_dir)
  agents = agent_checkpoints(agent_dir)
  pairs = find_pairs(buffer_dir, agent_dir)
  if not pairs:
    if buffers or agents:
      raise errors.CheckpointNotFoundError(
          f'cannot resume: no train step has both checkpoints. Buffer '
          f'checkpoints ({buffer_dir}) are at steps {sorted(buffers)}, agent '
          f'checkpoints ({agent_dir}) at steps {sorted(agents)}.')
    return None
  pair = pairs[0]
  newer = {'buffer': [s for s in buffers if s > pair.train_step],
           'agent': [s for s in agents if s > pair.train_step]}
  for side, steps in newer.items():
    if steps:
      logging.warning(
          'Resuming from the pair at train step %d: the %s checkpoint(s) at '
          'step(s) %s have no partner on the other side and are not used%s.',
          pair.train_step, side, sorted(steps),
          ' (experience collected after that step is dropped)'
          if side == 'buffer' else '')
  return pair


@gin.configurable
class PairedCheckpointer:
  """Checkpoints the agent and the replay buffer at the same train step.

  Use it as a `tf_agents.train.Learner` trigger (`triggers=[paired]`, with the
  Learner's own checkpointing off: `checkpoint_interval=-1`), or call it from
  a custom loop with the current train step. It saves when `interval` train
  steps have passed since the last save (or when forced).

  Args:
    manager: the run's started `ReplayBufferManager`.
    agent_dir: where the agent checkpoints go (`ckpt-<train_step>`).
    train_step: the train step variable.
    interval: train steps between saves (> 0).
    keep: agent checkpoints to keep; default the buffer's keep + 1, so every
      kept buffer checkpoint has its agent partner.
    **trackables: what to checkpoint besides `train_step` (e.g. `agent=`).

  Raises:
    ValueError: if `interval` < 1 or no trackable is given.
  """

  def __init__(self, manager: manager_lib.ReplayBufferManager, *,
               agent_dir: str, train_step: tf.Variable, interval: int,
               keep: Optional[int] = None, **trackables: Any):
    checks.positive('interval', interval, integer=True)
    if not trackables:
      raise ValueError('PairedCheckpointer needs something to checkpoint, e.g. '
                       'agent=agent.')
    if keep is not None:
      checks.positive('keep', keep, integer=True)
    self._manager = manager
    self._train_step = train_step
    self._checkpoint = tf.train.Checkpoint(train_step=train_step, **trackables)
    self._agent_manager = tf.train.CheckpointManager(
        self._checkpoint, agent_dir,
        max_to_keep=keep or manager.keep_checkpoints + 1)
    self._saved = None  # What the trigger's last save returned.
    self.last_saved: Optional[Pair] = None  # The newest pair saved.
    # Counts the interval from the current step (0 for a new run); the
    # Learner also calls set_start() when it is built.
    self._trigger = interval_trigger.IntervalTrigger(
        interval, self._save_on_trigger, start=int(train_step.numpy()))

  def set_start(self, train_step: int) -> None:
    """Counts the interval from `train_step` (called by `Learner`).

    Args:
      train_step: the step training starts or resumes at.
    """
    self._trigger.set_start(int(train_step))

  def __call__(self, train_step: Optional[int] = None,
               force_trigger: bool = False) -> Optional[Pair]:
    """Saves a pair if `interval` steps passed since the last one.

    Args:
      train_step: the current train step (read from the variable if None).
      force_trigger: save regardless of the interval.

    Returns:
      The saved `Pair`, or None if it was not time yet.
    """
    if force_trigger:
      return self.save()
    step = int(self._train_step.numpy()) if train_step is None else int(
        train_step)
    self._saved = None
    self._trigger(step)
    return self._saved

  def _save_on_trigger(self) -> None:
    self._saved = self.save()

  def save(self) -> Pair:
    """Saves the buffer (with the train step in its manifest), then the agent.

    Returns:
      The saved `Pair`.
    """
    step = int(self._train_step.numpy())
    buffer_path = self._manager.checkpoint(extra={'train_step': step})
    agent_path = self._agent_manager.save(checkpoint_number=step)
    self._trigger.set_start(step)
    logging.info('Saved the buffer and the agent at train step %d.', step)
    self.last_saved = Pair(step, buffer_path, agent_path)
    return self.last_saved

  def save_unless_saved(self) -> Pair:
    """Saves a pair unless the newest one is at the current train step.

    A run's final save calls it: when the last step is a multiple of
    `interval`, the trigger has just saved that step, and a second pair of
    the same step would use up a kept checkpoint (and drop the buffer
    partner of an older agent checkpoint).

    Returns:
      The pair at the current train step.
    """
    step = int(self._train_step.numpy())
    if self.last_saved is not None and self.last_saved.train_step == step:
      return self.last_saved
    return self.save()

  def restore_agent(self, pair: Pair) -> None:
    """Restores the agent side of `pair` (the buffer is loaded separately).

    Call it after building the `Learner`: its constructor runs
    `agent.initialize()`, which copies the online networks over the targets.

    Args:
      pair: from `newest_pair`.

    Raises:
      CheckpointCorruptError: if the agent checkpoint does not restore the
        objects this checkpointer tracks.
    """
    try:
      self._checkpoint.restore(pair.agent_checkpoint
                               ).assert_existing_objects_matched()
    except (AssertionError, tf.errors.OpError, ValueError) as e:
      raise errors.CheckpointCorruptError(
          f'agent checkpoint {pair.agent_checkpoint} does not match this '
          f'agent: {e}') from e
    self._trigger.set_start(pair.train_step)
