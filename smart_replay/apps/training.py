"""Training an agent from a starter buffer, resumable after a crash.

`train_from_starter` reads the starter buffer's manifest (spec, capacity,
sequence length) and provenance (environment) instead of guessing them, checks
that the agent's `collect_data_spec` matches the starter's spec, and trains
with a `tf_agents.train.Actor` and `Learner`. The starter is only read; how
its data is used is `starter_mode`:

- 'copy': the run's buffer starts as a copy of the starter, sampled in
  proportion to its share of the table and evicted (FIFO) as new data comes;
- 'mix': the starter is served read-only beside the run's (online) buffer,
  which starts empty; each batch draws every element from the starter with
  probability `starter_fraction`, fixed or annealed over train steps (see
  `smart_replay.mixing`); the run's checkpoints record the starter by path
  and fingerprint instead of copying it, and a resume continues the schedule
  at the restored train step;
- 'none': the starter only gives the spec and environment; training uses
  only the run's own experience (a baseline).

A `PairedCheckpointer` saves the agent and the buffer at the same train
steps, so `resume=True` continues from a matching pair.

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
                        `smart_replay.telemetry`; 'mix' adds
                        buffer/starter/fraction, the scheduled share, and
                        buffer/starter/sampled_fraction, the share the
                        batches made since the last point had); at each
                        evaluation, the
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

from smart_replay import errors
from smart_replay.apps import agents
from smart_replay.apps import evaluation
from smart_replay.apps import train_checks
from smart_replay.apps import train_progress
from smart_replay.apps import train_summaries
from smart_replay.apps.envs import factory as env_factory
from smart_replay.integrations import paired as paired_checkpoint
from smart_replay.manager import facade as manager_lib
from smart_replay.sampling import mixing as mixing_dataset
from smart_replay.utils import checks

MODES = train_checks.MODES
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
    starter_mode: 'copy', 'mix' or 'none' (see the module docstring).
    starter_items: items of the read-only starter table ('mix'), else None.
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
  starter_mode: str = 'copy'
  starter_items: Optional[int] = None


@gin.configurable(denylist=['stop_requested'])
def train_from_starter(
    *, starter_dir: str, run_dir: str, agent: str = 'auto',
    env: Optional[str] = None, num_train_steps: int = 2000,
    collect_steps_per_iteration: int = 100,
    train_steps_per_iteration: int = 100, batch_size: int = 64,
    checkpoint_every: int = 500, resume: bool = False,
    overwrite: bool = False, seed: int = 0, eval_episodes: int = 5,
    eval_interval: int = 0, log_every_s: float = 10.0,
    show_progress: bool = False, starter_mode: str = 'copy',
    starter_fraction: Optional[float] = None,
    starter_fraction_final: Optional[float] = None,
    starter_fraction_steps: Optional[int] = None,
    starter_fraction_schedule: str = 'linear',
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
    starter_mode: 'copy', 'mix' or 'none' (see the module docstring).
    starter_fraction: 'mix': the starter's share of each batch at train step
      0, in [0, 1] (default 0.5).
    starter_fraction_final: 'mix': the share to anneal to (None: fixed).
    starter_fraction_steps: 'mix': train steps over which it is annealed.
    starter_fraction_schedule: 'linear' or 'exponential' (see
      `mixing.FractionSchedule`).
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
    StarterMismatchError: if a 'mix' run is resumed with a starter whose
      fingerprint differs from the recorded one (lists both), or a run is
      resumed in another `starter_mode` than it was started in.
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
  schedule = train_checks.fraction_schedule(
      starter_mode, starter_fraction, starter_fraction_final,
      starter_fraction_steps, starter_fraction_schedule)
  run_dir = os.path.abspath(run_dir)
  buffer_dir = os.path.join(run_dir, BUFFER_DIR)
  agent_dir = os.path.join(run_dir, AGENT_DIR)
  tf.random.set_seed(seed)

  # Everything about the buffer comes from the starter's manifest.
  manager = manager_lib.ReplayBufferManager.from_checkpoint(
      starter_dir, checkpoint_dir=buffer_dir,
      starter_dir=starter_dir if schedule else None)
  env_name = env or train_checks.starter_env(starter_dir)
  environment = env_factory.make_environment(env_name, seed=seed)
  train_step = train_utils.create_train_step()
  tf_agent = agents.make_agent(
      agent, time_step_spec=environment.time_step_spec(),
      action_spec=environment.action_spec(), train_step=train_step)
  train_checks.check_spec(starter_dir, manager.data_spec,
                          tf_agent.collect_data_spec)
  train_checks.check_no_ratio_limiter(starter_dir, manager.table_configs,
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
    if pair is None and starter_mode == 'copy':
      manager.load_replay_buffer(starter_dir, overwrite=overwrite)
    elif pair is None:  # The online table starts empty.
      manager.create_replay_buffer(overwrite=overwrite)
    elif bool(manager.starter) != bool(schedule):
      raise errors.StarterMismatchError(
          f'{run_dir} was trained with '
          f"starter_mode={'mix' if manager.starter else 'copy or none'}; "
          f'resume it in that mode, not {starter_mode!r}.',
          [('starter_mode', 'mix' if manager.starter else 'copy/none',
            starter_mode)])
    if pair is None:
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
    sampled = tf.Variable([0, 0], dtype=tf.int64, trainable=False)
    trainer = learner.Learner(
        run_dir, train_step, tf_agent,
        experience_dataset_fn=lambda: mixing_dataset.count_sources(
            manager.get_dataset(batch_size=batch_size, num_steps=2,
                                train_step=train_step,
                                starter_fraction=schedule), sampled),
        checkpoint_interval=-1,  # The PairedCheckpointer saves the agent.
        triggers=[paired],
        summary_interval=train_steps_per_iteration)
    writer = trainer.train_summary_writer
    share = (train_summaries.StarterShare(schedule, sampled) if schedule
             else None)
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
        train_summaries.write_summaries(writer, collect_metrics, manager,
                                        step, share)
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
      train_summaries.write_summaries(writer, collect_metrics, manager,
                                      int(train_step.numpy()), share)
    greedy = evaluate() if eval_episodes else None
    writer.flush()
    result = TrainResult(
        run_dir=run_dir, train_step=int(train_step.numpy()),
        resumed_from=pair.train_step if pair else None,
        items_at_start=items_at_start,
        items_collected=observer.num_items - collected_before,
        items=manager.num_frames(), greedy_return=greedy, checkpoint=last,
        interrupted=interrupted, starter_mode=starter_mode,
        starter_items=manager.starter.items if manager.starter else None)
  return result


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
