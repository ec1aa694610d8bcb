"""Processes the durability tests kill: a manager that writes and checkpoints.

Children start from a multiprocessing `forkserver` that has imported
TensorFlow, Reverb and smart_replay once (no server or client exists there
before the fork), so each of the many kill rounds starts in a fraction of a
second. Every step is deterministic: round r writes `EPISODES_PER_ROUND`
episodes of `EPISODE_LENGTH` steps whose observation is the step's global
index, so the items a checkpoint must hold follow from the rounds it holds.
"""

import os
import signal

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from tf_agents.specs import tensor_spec  # pylint: disable=g-import-not-at-top
from tf_agents.trajectories import time_step as ts  # pylint: disable=g-import-not-at-top
from tf_agents.trajectories import trajectory  # pylint: disable=g-import-not-at-top

import smart_replay  # pylint: disable=g-import-not-at-top
from smart_replay.storage import store as checkpoint_store  # pylint: disable=g-import-not-at-top

EPISODE_LENGTH = 5
EPISODES_PER_ROUND = 2
STEPS_PER_ROUND = EPISODE_LENGTH * EPISODES_PER_ROUND
SEQUENCE_LENGTH = 2


def data_spec():
  """A tiny real TF-Agents trajectory spec."""
  observation = tf.TensorSpec([1], tf.float32)
  action = tensor_spec.BoundedTensorSpec([], tf.int32, 0, 3)
  return trajectory.Trajectory(
      step_type=ts.time_step_spec(observation).step_type,
      observation=observation, action=action, policy_info=(),
      next_step_type=ts.time_step_spec(observation).step_type,
      reward=tf.TensorSpec([], tf.float32),
      discount=tf.TensorSpec([], tf.float32))


def make_manager(buffer_dir, **kwargs):
  """The manager every process of a durability test builds (without a
  journal unless asked: these tests hold it to its checkpoints)."""
  kwargs.setdefault('capacity', 100_000)
  kwargs.setdefault('journal', False)
  return smart_replay.ReplayBufferManager(
      data_spec=data_spec(), checkpoint_dir=buffer_dir,
      sequence_length=SEQUENCE_LENGTH, write_timeout_s=30.0,
      checkpoint_timeout_s=60.0, **kwargs)


def round_steps(round_index):
  """The trajectories of one round: whole episodes, observation = index."""
  steps = []
  for i in range(STEPS_PER_ROUND):
    position = i % EPISODE_LENGTH
    step_type = (ts.StepType.FIRST if position == 0 else
                 ts.StepType.LAST if position == EPISODE_LENGTH - 1 else
                 ts.StepType.MID)
    next_type = (ts.StepType.LAST if position >= EPISODE_LENGTH - 2 else
                 ts.StepType.MID)
    if position == EPISODE_LENGTH - 1:
      next_type = ts.StepType.FIRST
    index = round_index * STEPS_PER_ROUND + i
    steps.append(trajectory.Trajectory(
        step_type=np.int32(step_type),
        observation=np.array([index], np.float32),
        action=np.int32(index % 4), policy_info=(),
        next_step_type=np.int32(next_type),
        reward=np.float32(index), discount=np.float32(1.0)))
  return steps


def expected_first_steps(rounds):
  """The observation of the first step of every item the rounds make."""
  firsts = []
  for r in rounds:
    for e in range(EPISODES_PER_ROUND):
      start = r * STEPS_PER_ROUND + e * EPISODE_LENGTH
      firsts += range(start, start + EPISODE_LENGTH - SEQUENCE_LENGTH + 1)
  return sorted(float(x) for x in firsts)


def stored_first_steps(manager):
  """The first observation of every item the running server holds (exact)."""
  firsts = []
  for batch, _ in manager.epoch(64, drop_remainder=False):
    firsts += [float(x) for x in batch.observation[:, 0, 0]]
  return sorted(firsts)


def write_round(observer, round_index):
  """Writes the steps of one round and flushes them."""
  for step in round_steps(round_index):
    observer(step)
  observer.flush()


def new_buffer_with_round(buffer_dir):
  """A new buffer holding round 0: `(manager, replay_buffer, observer)`."""
  manager = make_manager(buffer_dir)
  replay_buffer, observer = manager.create_replay_buffer()
  write_round(observer, 0)
  return manager, replay_buffer, observer


def open_buffer(buffer_dir):
  """Loads the buffer at `buffer_dir`, or creates it if it has no checkpoint."""
  manager = make_manager(buffer_dir)
  try:
    _, observer = manager.load_replay_buffer()
  except smart_replay.CheckpointNotFoundError:
    _, observer = manager.create_replay_buffer()
  return manager, observer


def write_and_die_at(buffer_dir, round_index, step, conn):
  """Writes one round and checkpoints it; SIGKILLs itself at commit `step`."""
  def die(reached):
    if reached == step:
      conn.send(('dying', reached))
      os.kill(os.getpid(), signal.SIGKILL)
  checkpoint_store._fault_point = die  # pylint: disable=protected-access
  manager, observer = open_buffer(buffer_dir)
  write_round(observer, round_index)
  conn.send(('saving', round_index))
  manager.checkpoint(extra={'round': round_index})
  conn.send(('survived', round_index))


def write_until_killed(buffer_dir, first_round, conn):
  """Writes and checkpoints rounds in a loop, reporting each commit."""
  manager, observer = open_buffer(buffer_dir)
  round_index = first_round
  while True:
    write_round(observer, round_index)
    path = manager.checkpoint(extra={'round': round_index})
    conn.send(('committed', round_index, path))
    round_index += 1


def hold_open(buffer_dir, conn):
  """Opens the buffer and keeps it open until killed."""
  manager, _ = open_buffer(buffer_dir)
  conn.send(('open', os.getpid()))
  conn.recv()  # Blocks until the parent closes its end or kills us.
  manager.close()
