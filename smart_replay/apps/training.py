"""Training an agent from a starter buffer, resumable after a crash.

`train_from_starter` takes a `TrainConfig` (`train_config`: what to train,
which starter and how it is used, the loop, where the run writes; each group
checked when made), or the flat fields of its groups as keyword arguments.
It reads the starter buffer's manifest (spec, capacity, sequence length) and
provenance (environment) instead of guessing them, checks that the agent's
`collect_data_spec` matches the starter's spec, and trains with a
`tf_agents.train.Actor` and `Learner`. The starter is only read; how its
data is used is `starter_mode`:

- 'copy': the run's buffer starts as a copy of the starter, sampled in
  proportion to its share of the table and evicted (FIFO) as new data comes;
- 'mix': the starter is served read-only beside the run's (online) buffer,
  which starts empty; each batch draws every element from the starter with
  probability `starter_fraction`, fixed or annealed over train steps (see
  `smart_replay.sampling.fraction_schedule`); the run's checkpoints record
  the starter by path and fingerprint instead of copying it, and a resume
  continues the schedule at the restored train step;
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
                        `smart_replay.integrations.summaries`; 'mix' adds
                        buffer/starter/fraction, the scheduled share, and
                        buffer/starter/sampled_fraction, the share the
                        batches made since the last point had); at each
                        evaluation, the greedy policy's eval/AverageReturn
                        and eval/AverageEpisodeLength
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
from typing import Any, Callable, Optional, Tuple

from absl import logging
import tensorflow as tf
from tf_agents.policies import py_tf_eager_policy
from tf_agents.train import actor
from tf_agents.train import learner
from tf_agents.train.utils import train_utils

from smart_replay import errors
from smart_replay.apps import agents
from smart_replay.apps import evaluation
from smart_replay.apps import train_checks
from smart_replay.apps import train_config
from smart_replay.apps import train_progress
from smart_replay.apps.envs import factory as env_factory
from smart_replay.integrations import paired as paired_checkpoint
from smart_replay.manager import facade as manager_lib
from smart_replay.sampling import fraction_schedule as schedule_lib
from smart_replay.sampling import dataset as mixing_dataset

MODES = train_config.MODES
BUFFER_DIR = train_config.BUFFER_DIR
AGENT_DIR = train_config.AGENT_DIR
SUMMARY_DIR = train_config.SUMMARY_DIR
EVAL_DIR = train_config.EVAL_DIR
TrainConfig = train_config.TrainConfig

# The py policy's mean return over some episodes (kept here for callers).
greedy_return = evaluation.greedy_return


@dataclasses.dataclass
class TrainResult:
  """What a training call did.

  Attributes:
    run_dir: the run directory.
    train_step: the train step reached.
    resumed_from: the train step of the pair resumed from, or None.
    items_at_start: buffer items after loading (starter or resumed pair),
      including `items_replayed`.
    items_replayed: items the buffer's journal wrote again above the loaded
      checkpoint (what a killed run collected after its last save).
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
  items_replayed: int
  items_collected: int
  items: int
  greedy_return: Optional[float]
  checkpoint: paired_checkpoint.Pair
  interrupted: bool
  starter_mode: str = 'copy'
  starter_items: Optional[int] = None


def train_from_starter(config: Optional[TrainConfig] = None, *,
                       stop_requested: Optional[Callable[[], bool]] = None,
                       **fields: Any) -> TrainResult:
  """Trains an agent from a starter buffer; resumable from a matching pair.

  Args:
    config: what to do, as a `TrainConfig`; or None to build it from
      `fields`.
    stop_requested: polled between iterations; True stops after a final
      checkpoint.
    **fields: the fields of `TrainConfig`'s groups by name, when `config`
      is None (a field not given takes its gin binding, else its default):
      `AgentSetup` (agent, env, seed), `StarterUse` (starter_dir,
      starter_mode, starter_fraction, starter_fraction_final,
      starter_fraction_steps, starter_fraction_schedule), `TrainLoop`
      (num_train_steps, collect_steps_per_iteration,
      train_steps_per_iteration, batch_size, checkpoint_every,
      eval_episodes, eval_interval) and `RunOutput` (run_dir, resume,
      overwrite, show_progress, log_every_s).

  Returns:
    A `TrainResult`.

  Raises:
    TypeError: on an unknown field.
    ValueError: on a bad field (names it and its value), `config` given
      with fields, or if the starter's sequence length does not give the
      2-step transitions DQN and SAC train on.
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
  config = _as_config(config, fields)
  setup, starter = config.agent_setup, config.starter
  loop, output = config.loop, config.output
  tf.random.set_seed(setup.seed)
  # Everything about the buffer comes from the starter's manifest.
  manager = manager_lib.ReplayBufferManager.from_checkpoint(
      starter.starter_dir, checkpoint_dir=output.buffer_dir,
      starter_dir=starter.starter_dir if starter.schedule else None)
  env_name = setup.env or train_checks.starter_env(starter.starter_dir)
  environment = env_factory.make_environment(env_name, seed=setup.seed)
  train_step = train_utils.create_train_step()
  tf_agent = agents.make_agent(
      setup.agent, time_step_spec=environment.time_step_spec(),
      action_spec=environment.action_spec(), train_step=train_step)
  train_checks.check_starter(
      starter.starter_dir, manager, tf_agent.collect_data_spec,
      collect_steps=loop.collect_steps_per_iteration,
      samples=loop.samples_per_iteration)

  with manager:
    pair = _find_pair(manager, output)
    _start_buffer(manager, starter, output, resuming=pair is not None)
    paired = paired_checkpoint.PairedCheckpointer(
        manager, agent_dir=output.agent_dir, train_step=train_step,
        interval=loop.checkpoint_every, agent=tf_agent)
    items_at_start = manager.num_frames()
    journal = manager.stats().get('journal')
    items_replayed = journal['replayed']['items'] if journal else 0
    collected_before = manager.observer.num_items
    collect, collect_metrics = _collect_actor(
        environment, tf_agent, train_step, manager.observer,
        loop.collect_steps_per_iteration)
    trainer, share = _learner(output.run_dir, tf_agent, train_step, manager,
                              loop, starter.schedule, paired)
    if pair:
      _restore_agent(paired, pair, output.run_dir, manager)
    writer = trainer.train_summary_writer
    evaluate = evaluation.Evaluation(
        env_name, setup.seed, tf_agent, train_step,
        episodes=loop.eval_episodes, summary_dir=output.eval_dir,
        train_writer=writer)
    report = train_progress.TrainReport(
        writer=writer, collect_metrics=collect_metrics, manager=manager,
        share=share, progress=train_progress.TrainProgress(
            total=loop.num_train_steps, start=int(train_step.numpy()),
            env_steps=0, show_progress=output.show_progress,
            log_every_s=output.log_every_s, summary_writer=writer))

    interrupted = _run_loop(loop, train_step, collect, trainer, report,
                            evaluate, stop_requested)
    last = paired.save_unless_saved()
    report.finish(int(train_step.numpy()))
    greedy = evaluate() if loop.eval_episodes else None
    writer.flush()
    return TrainResult(
        run_dir=output.run_dir, train_step=int(train_step.numpy()),
        resumed_from=pair.train_step if pair else None,
        items_at_start=items_at_start, items_replayed=items_replayed,
        items_collected=manager.observer.num_items - collected_before,
        items=manager.num_frames(), greedy_return=greedy, checkpoint=last,
        interrupted=interrupted, starter_mode=starter.starter_mode,
        starter_items=manager.starter.items if manager.starter else None)


def _as_config(config: Optional[TrainConfig], fields: dict) -> TrainConfig:
  """`config` as given, or built from `fields`; not both."""
  if config is None:
    return TrainConfig.from_fields(**fields)
  if fields:
    raise ValueError(f'train_from_starter takes a TrainConfig or its fields, '
                     f'not both; got config= and {sorted(fields)}.')
  if not isinstance(config, TrainConfig):
    raise ValueError(f'config must be a TrainConfig or None, got '
                     f'{config!r}.')
  return config


def _find_pair(manager: manager_lib.ReplayBufferManager,
               output: train_config.RunOutput
               ) -> Optional[paired_checkpoint.Pair]:
  """The pair to resume from (its buffer loaded), or None to start anew.

  Raises:
    CheckpointExistsError: if the run exists and neither `resume` nor
      `overwrite` is set.
  """
  if output.resume:
    pair = _load_newest_usable_pair(manager, output.buffer_dir,
                                    output.agent_dir)
    if pair is None:
      logging.warning('resume: %s has no checkpoints yet; starting from the '
                      'starter buffer.', output.run_dir)
    return pair
  if (manager.existing_checkpoints() or
      paired_checkpoint.agent_checkpoints(output.agent_dir)
      ) and not output.overwrite:
    raise errors.CheckpointExistsError(
        f'{output.run_dir} already holds a run; pass resume=True to continue '
        'it or overwrite=True to start again.')
  return None


def _start_buffer(manager: manager_lib.ReplayBufferManager,
                  starter: train_config.StarterUse,
                  output: train_config.RunOutput, *, resuming: bool) -> None:
  """Starts a new run's buffer as `starter_mode` says, or checks that a
  resumed one was made in that mode; clears an overwritten run's agent and
  TensorBoard directories once the new buffer is up.

  Raises:
    StarterMismatchError: if the resumed run used the other kind of mode.
  """
  if resuming:
    if bool(manager.starter) != bool(starter.schedule):
      was = 'mix' if manager.starter else 'copy or none'
      raise errors.StarterMismatchError(
          f'{output.run_dir} was trained with starter_mode={was}; resume it '
          f'in that mode, not {starter.starter_mode!r}.',
          [('starter_mode', 'mix' if manager.starter else 'copy/none',
            starter.starter_mode)])
    return
  if starter.starter_mode == 'copy':
    manager.load_replay_buffer(starter.starter_dir, overwrite=output.overwrite)
  else:  # The online table starts empty.
    manager.create_replay_buffer(overwrite=output.overwrite)
  # The Learner restores from its own train/checkpoints when built, so the
  # old run's must go too.
  for old in (output.agent_dir, output.summary_dir, output.eval_dir):
    if output.overwrite and tf.io.gfile.exists(old):
      tf.io.gfile.rmtree(old)


def _collect_actor(environment: Any, tf_agent: Any, train_step: tf.Variable,
                   observer: Any, steps_per_run: int
                   ) -> Tuple[actor.Actor, list]:
  """The collect Actor and TF-Agents' standard collect metrics.

  The Actor writes no summaries itself: its metrics go into the Learner's
  train/ writer with the buffer scalars, one event file (TensorBoard polls
  only a directory's newest).
  """
  collect_metrics = actor.collect_metrics(buffer_size=10)
  collect = actor.Actor(
      environment,
      py_tf_eager_policy.PyTFEagerPolicy(tf_agent.collect_policy,
                                         use_tf_function=True),
      train_step, steps_per_run=steps_per_run, observers=[observer],
      metrics=collect_metrics)
  return collect, collect_metrics


def _learner(run_dir: str, tf_agent: Any, train_step: tf.Variable,
             manager: manager_lib.ReplayBufferManager,
             loop: train_config.TrainLoop,
             schedule: Optional[schedule_lib.FractionSchedule],
             paired: paired_checkpoint.PairedCheckpointer
             ) -> Tuple[learner.Learner, Optional[train_progress.StarterShare]]:
  """The Learner on the buffer's 2-step batches, saving pairs as a trigger,
  and the starter's share of its batches ('mix', else None)."""
  sampled = tf.Variable([0, 0], dtype=tf.int64, trainable=False)
  trainer = learner.Learner(
      run_dir, train_step, tf_agent,
      experience_dataset_fn=lambda: mixing_dataset.count_sources(
          manager.get_dataset(batch_size=loop.batch_size, num_steps=2,
                              train_step=train_step,
                              starter_fraction=schedule), sampled),
      checkpoint_interval=-1,  # The PairedCheckpointer saves the agent.
      triggers=[paired],
      summary_interval=loop.train_steps_per_iteration)
  share = (train_progress.StarterShare(schedule, sampled) if schedule
           else None)
  return trainer, share


def _restore_agent(paired: paired_checkpoint.PairedCheckpointer,
                   pair: paired_checkpoint.Pair, run_dir: str,
                   manager: manager_lib.ReplayBufferManager) -> None:
  """Restores the agent of `pair` and counts checkpoints from its step.

  After the Learner: its constructor's agent.initialize() copies the online
  networks over the target networks.
  """
  paired.restore_agent(pair)
  paired.set_start(pair.train_step)
  logging.info('Resumed %s at train step %d with %d buffer items.',
               run_dir, pair.train_step, manager.num_frames())


def _run_loop(loop: train_config.TrainLoop, train_step: tf.Variable,
              collect: actor.Actor, trainer: learner.Learner,
              report: train_progress.TrainReport,
              evaluate: evaluation.Evaluation,
              stop_requested: Optional[Callable[[], bool]]) -> bool:
  """Collects and trains in turns up to `num_train_steps`.

  Returns:
    True if a stop was requested before the target step.
  """
  try:
    while (step := int(train_step.numpy())) < loop.num_train_steps:
      if stop_requested is not None and stop_requested():
        return True
      collect.run()
      loss = trainer.run(iterations=loop.train_steps_from(step))
      step = int(train_step.numpy())
      report.phase(step, float(loss.loss))
      if loop.evaluates_after(step):
        evaluate()  # The last step's evaluation comes after the loop.
    return False
  finally:
    report.close()


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
