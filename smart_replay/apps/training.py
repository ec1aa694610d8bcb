"""Training an agent from a starter buffer, resumable after a crash.

`train_from_starter` reads the starter buffer's manifest (spec, capacity,
sequence length) and provenance (environment) instead of guessing them, checks
that the agent's `collect_data_spec` matches the starter's spec, copies the
starter into the run's own buffer (the starter is only read), and trains with a
`tf_agents.train.Actor` and `Learner`. A `PairedCheckpointer` saves the agent
and the buffer at the same train steps, so `resume=True` continues from a
matching pair.

Run layout::

    <run_dir>/buffer/   the run's replay buffer (checkpoints with train_step)
    <run_dir>/agent/    agent checkpoints ckpt-<train_step>
    <run_dir>/train/    TensorBoard, one event file (the Learner's writer):
                        the agent's summaries (Losses/*, ...); after each
                        collect + train phase, TF-Agents' collect metrics
                        (Metrics/AverageReturn, AverageEpisodeLength,
                        EnvironmentSteps, NumberOfEpisodes,
                        EnvironmentStepsPerSecond), train_steps_per_sec and
                        the buffer's scalars (buffer/*, see
                        `smart_replay.telemetry`); at each evaluation, the
                        greedy policy's eval/AverageReturn and
                        eval/AverageEpisodeLength
    <run_dir>/eval/     TensorBoard: the same evaluation as TF-Agents' eval
                        actor writes it (Metrics/AverageReturn and
                        Metrics/AverageEpisodeLength), drawn on the collect
                        metrics' charts as the run `eval`

All steps are train steps. The collect metrics go into the Learner's writer
rather than an Actor writer of their own: TensorBoard (without
`--reload_multifile`) polls only the newest event file of a directory, so a
second writer in train/ would freeze one of them in a live view.
"""

import dataclasses
import os
from typing import Callable, Optional

from absl import logging
import gin
import tensorflow as tf
from tf_agents.policies import py_tf_eager_policy
from tf_agents.train import actor
from tf_agents.train import learner
from tf_agents.train.utils import train_utils

from smart_replay.apps import agents
from smart_replay.apps import evaluation
from smart_replay.apps import train_progress
from smart_replay import errors
from smart_replay import manager as manager_lib
from smart_replay.checkpointing import paired as paired_checkpoint
from smart_replay.apps.envs import factory as env_factory
from smart_replay.core import checks
from smart_replay.core import specs
from smart_replay import telemetry
from smart_replay.tools import provenance

BUFFER_DIR = 'buffer'
AGENT_DIR = 'agent'
SUMMARY_DIR = 'train'
EVAL_DIR = 'eval'

# The py policy's mean return over some episodes (kept here for callers).
greedy_return = evaluation.greedy_return


@dataclasses.dataclass
class TrainResult:
  """What a training call did.

  Attributes:
    run_dir: the run directory.
    train_step: the train step reached.
    resumed_from: the train step of the pair resumed from, or None.
    items_at_start: buffer items after loading (starter or resumed pair).
    items_collected: items the run's actor wrote in this session.
    items: buffer items at the end.
    greedy_return: mean return of the greedy policy on the evaluation
      episodes (None if `eval_episodes` is 0).
    checkpoint: the last saved pair.
    interrupted: True if a stop was requested before the target step.
  """
  run_dir: str
  train_step: int
  resumed_from: Optional[int]
  items_at_start: int
  items_collected: int
  items: int
  greedy_return: Optional[float]
  checkpoint: paired_checkpoint.Pair
  interrupted: bool


def _starter_env(starter_dir: str) -> str:
  try:
    return provenance.read_provenance(starter_dir)['env']
  except (OSError, ValueError, KeyError) as e:
    raise ValueError(
        f'cannot tell which environment {starter_dir} was collected in: its '
        f'{provenance.PROVENANCE_NAME} is missing or has no "env" ({e}). Pass '
        'env= explicitly.') from None


@gin.configurable(denylist=['stop_requested'])
def train_from_starter(
    *, starter_dir: str, run_dir: str, agent: str = 'auto',
    env: Optional[str] = None, num_train_steps: int = 2000,
    collect_steps_per_iteration: int = 100,
    train_steps_per_iteration: int = 100, batch_size: int = 64,
    checkpoint_every: int = 500, resume: bool = False,
    overwrite: bool = False, seed: int = 0, eval_episodes: int = 5,
    eval_interval: int = 0, log_every_s: float = 10.0,
    show_progress: bool = False,
    stop_requested: Optional[Callable[[], bool]] = None) -> TrainResult:
  """Trains an agent from a starter buffer; resumable from a matching pair.

  Args:
    starter_dir: a starter buffer (from the populate command); only read.
    run_dir: this run's directory (see module docstring).
    agent: 'auto', 'dqn' or 'sac' (see `agents.make_agent`).
    env: environment name; default the one in the starter's provenance.
    num_train_steps: train step to reach.
    collect_steps_per_iteration: actor steps between training phases.
    train_steps_per_iteration: learner steps per training phase.
    batch_size: training batch size.
    checkpoint_every: train steps between paired checkpoints.
    resume: continue `run_dir` from its newest agent/buffer pair.
    overwrite: replace an existing run instead of refusing.
    seed: environment and TF seed.
    eval_episodes: greedy evaluation episodes at the end (0 to skip), and
      every `eval_interval` train steps; written to `<run_dir>/eval`.
    eval_interval: train steps between evaluations during the run (0: only
      at the end).
    log_every_s: seconds between progress log lines (without a bar).
    show_progress: draw a progress bar (train steps with rate and ETA, env
      steps, episodes, recent return) instead of log lines.
    stop_requested: polled between iterations; True stops after a final
      checkpoint.

  Returns:
    A `TrainResult`.

  Raises:
    ValueError: on a bad argument, or if the starter's sequence length does
      not give the 2-step transitions DQN and SAC train on.
    WouldBlockError: if the starter has a samples_per_insert or queue
      limiter (the alternating loop would stall on it).
    ManifestMismatchError: if the starter's spec does not match the agent's
      `collect_data_spec` (lists each difference).
    CheckpointExistsError: if `run_dir` has checkpoints and neither `resume`
      nor `overwrite` is set.
    CheckpointNotFoundError: if `resume` finds checkpoints but no pair.
  """
  for name, value in (('num_train_steps', num_train_steps),
                      ('collect_steps_per_iteration',
                       collect_steps_per_iteration),
                      ('train_steps_per_iteration', train_steps_per_iteration),
                      ('batch_size', batch_size),
                      ('checkpoint_every', checkpoint_every)):
    checks.positive(name, value, integer=True)
  for name, value, zero in (('eval_interval', eval_interval,
                             'evaluate at the end only'),
                            ('eval_episodes', eval_episodes, 'no evaluation')):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise ValueError(f'{name} must be a non-negative integer (0: {zero}), '
                       f'got {value!r}.')
  if resume and overwrite:
    raise ValueError('resume and overwrite exclude each other.')
  run_dir = os.path.abspath(run_dir)
  buffer_dir = os.path.join(run_dir, BUFFER_DIR)
  agent_dir = os.path.join(run_dir, AGENT_DIR)
  tf.random.set_seed(seed)

  # Everything about the buffer comes from the starter's manifest.
  manager = manager_lib.ReplayBufferManager.from_checkpoint(
      starter_dir, checkpoint_dir=buffer_dir)
  env_name = env or _starter_env(starter_dir)
  environment = env_factory.make_environment(env_name, seed=seed)
  train_step = train_utils.create_train_step()
  tf_agent = agents.make_agent(agent, time_step_spec=environment.time_step_spec(),
                               action_spec=environment.action_spec(),
                               train_step=train_step)
  _check_spec(starter_dir, manager.data_spec, tf_agent.collect_data_spec)
  _check_no_ratio_limiter(starter_dir, manager.table_configs,
                          collect_steps_per_iteration,
                          train_steps_per_iteration * batch_size)
  sequence_length = manager.sequence_length
  if sequence_length % 2:
    raise ValueError(
        f'the starter {starter_dir} has sequence_length={sequence_length}; '
        'DQN and SAC train on 2-step transitions, so it must be even.')

  with manager:
    pair = None
    if resume:
      pair = _load_newest_usable_pair(manager, buffer_dir, agent_dir)
      if pair is None:
        logging.warning('resume: %s has no checkpoints yet; starting from the '
                        'starter buffer.', run_dir)
    elif (manager.existing_checkpoints() or
          paired_checkpoint.agent_checkpoints(agent_dir)) and not overwrite:
      raise errors.CheckpointExistsError(
          f'{run_dir} already holds a run; pass resume=True to continue it '
          'or overwrite=True to start again.')
    if pair is None:
      manager.load_replay_buffer(starter_dir, overwrite=overwrite)
      # Only once the new buffer is up. The Learner restores from its own
      # train/checkpoints when built, so the old run's must go too.
      for old in (agent_dir, os.path.join(run_dir, SUMMARY_DIR),
                  os.path.join(run_dir, EVAL_DIR)):
        if overwrite and tf.io.gfile.exists(old):
          tf.io.gfile.rmtree(old)
    paired = paired_checkpoint.PairedCheckpointer(
        manager, agent_dir=agent_dir, train_step=train_step,
        interval=checkpoint_every, agent=tf_agent)
    items_at_start = manager.num_frames()
    observer = manager.observer
    collected_before = observer.num_items

    # TF-Agents' standard collect metrics. The Actor writes no summaries
    # itself: they go into the Learner's train/ writer with the buffer
    # scalars, one event file (TensorBoard polls only a directory's newest).
    collect_metrics = actor.collect_metrics(buffer_size=10)
    collect = actor.Actor(
        environment,
        py_tf_eager_policy.PyTFEagerPolicy(tf_agent.collect_policy,
                                           use_tf_function=True),
        train_step, steps_per_run=collect_steps_per_iteration,
        observers=[observer], metrics=collect_metrics)
    episodes, env_steps, average_return, _ = collect_metrics
    trainer = learner.Learner(
        run_dir, train_step, tf_agent,
        experience_dataset_fn=lambda: manager.get_dataset(
            batch_size=batch_size, num_steps=2),
        checkpoint_interval=-1,  # The PairedCheckpointer saves the agent.
        triggers=[paired],
        summary_interval=train_steps_per_iteration)
    writer = trainer.train_summary_writer
    if pair:
      # After the Learner: its constructor's agent.initialize() copies the
      # online networks over the target networks.
      paired.restore_agent(pair)
      paired.set_start(pair.train_step)
      logging.info('Resumed %s at train step %d with %d buffer items.',
                   run_dir, pair.train_step, manager.num_frames())
    evaluate = evaluation.Evaluation(
        env_name, seed, tf_agent, train_step, episodes=eval_episodes,
        summary_dir=os.path.join(run_dir, EVAL_DIR), train_writer=writer)

    interrupted, written = False, None  # The step of the last summaries.
    progress = train_progress.TrainProgress(
        total=num_train_steps, start=int(train_step.numpy()), env_steps=0,
        show_progress=show_progress, log_every_s=log_every_s,
        summary_writer=writer)
    try:
      while int(train_step.numpy()) < num_train_steps:
        if stop_requested is not None and stop_requested():
          interrupted = True
          break
        collect.run()
        remaining = num_train_steps - int(train_step.numpy())
        loss = trainer.run(iterations=min(train_steps_per_iteration,
                                          remaining))
        step = written = int(train_step.numpy())
        _write_summaries(writer, collect_metrics, manager, step)
        progress.update(step=step, env_steps=int(env_steps.result()),
                        episodes=int(episodes.result()),
                        recent_return=float(average_return.result()),
                        items=manager.num_frames(), loss=float(loss.loss))
        if (eval_interval and step < num_train_steps and
            step % eval_interval < train_steps_per_iteration):
          evaluate()  # The last step's evaluation comes after the loop.
    finally:
      progress.close()
    last = paired.save_unless_saved()
    if written != int(train_step.numpy()):  # Stopped before any training.
      _write_summaries(writer, collect_metrics, manager,
                       int(train_step.numpy()))
    greedy = evaluate() if eval_episodes else None
    writer.flush()
    result = TrainResult(
        run_dir=run_dir, train_step=int(train_step.numpy()),
        resumed_from=pair.train_step if pair else None,
        items_at_start=items_at_start,
        items_collected=observer.num_items - collected_before,
        items=manager.num_frames(), greedy_return=greedy, checkpoint=last,
        interrupted=interrupted)
  return result


def _write_summaries(writer, collect_metrics, manager, step: int) -> None:
  """The collect metrics (as TF-Agents' `Actor.write_metric_summaries` names
  them) and the buffer's scalars, into `writer` at `step`."""
  with writer.as_default(), tf.summary.record_if(True):
    for metric in collect_metrics:
      tf.summary.scalar('Metrics/' + metric.name, metric.result(), step=step)
    telemetry.write_buffer_summaries(manager, step)


def _load_newest_usable_pair(manager, buffer_dir, agent_dir):
  """Loads the buffer of the newest pair that verifies; sets newer ones aside.

  Returns:
    The `Pair` whose buffer is loaded, or None if the run has no checkpoint.
  """
  newest = paired_checkpoint.newest_pair(buffer_dir, agent_dir)
  if newest is None:
    return None
  problems = []
  for pair in paired_checkpoint.find_pairs(buffer_dir, agent_dir):
    try:
      manager.load_replay_buffer(pair.buffer_checkpoint)
    except errors.CheckpointCorruptError as e:
      problems.append(str(e))
      logging.warning('Pair at train step %d is unusable: %s', pair.train_step,
                      e)
      continue
    paired_checkpoint.set_aside_newer_than(pair, buffer_dir, agent_dir)
    return pair
  raise errors.CheckpointCorruptError(
      f'no usable agent/buffer pair in {buffer_dir}: ' + ' | '.join(problems))


def _check_no_ratio_limiter(starter_dir, table_configs, collect_steps,
                            samples) -> None:
  """Raises WouldBlockError for limiters this alternating loop would stall.

  The loop collects, then trains, in turns: nothing samples while the actor
  runs and nothing inserts while the learner runs, and the loop itself fixes
  the ratio (`samples` per `collect_steps` steps). A samples_per_insert or
  queue limiter on top drifts against it (an episode's steps make fewer items
  than steps) until one side waits for the other, which never comes.
  """
  limited = [(c.name, c.samples_per_insert) for c in table_configs
             if c.samples_per_insert is not None or c.block_inserts_when_full]
  if limited:
    raise errors.WouldBlockError(
        f'the starter {starter_dir} has rate-limited tables {limited} '
        '(samples_per_insert or block_inserts_when_full). train_from_starter '
        'alternates collecting and training, which already fixes the ratio '
        f'at {samples} samples per {collect_steps} collected steps; a Reverb '
        'ratio limiter on top would drift until the actor or the learner '
        'waits forever for the other. Populate the starter with '
        'samples_per_insert=None, or run the actor and the learner '
        'concurrently (ratio limiting is meant for that).')


def _check_spec(starter_dir, starter_spec, agent_spec) -> None:
  """Raises ManifestMismatchError if the starter cannot feed the agent.

  Dtypes and shapes must match everywhere; bounds only for the action (DQN
  sizes its Q-head from them).
  """
  diffs = specs.diff_specs(starter_spec, agent_spec, bounds_for=('action',))
  if diffs:
    raise errors.ManifestMismatchError(
        f'the starter buffer {starter_dir} does not match the agent\'s '
        f'collect_data_spec ({len(diffs)} difference(s)):\n'
        + '\n'.join(f'  {field}: starter {a}, agent {b}'
                    for field, a, b in diffs), diffs)
