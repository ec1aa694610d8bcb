"""Populating a starter replay buffer from a baseline policy.

`populate_starter_buffer` runs a `tf_agents.train.Actor` with the baseline
policy for `num_runs` runs of `steps_per_run` steps, writing through a
`ReplayBufferManager` observer, checkpointing after every run, and recording
what was done in a provenance file. It can resume an interrupted buffer up to
the requested total, and stops cleanly (with a final checkpoint) when asked.
"""

import dataclasses
import datetime
import os
import time
from typing import Callable, Optional

from absl import logging
import gin
import numpy as np
from tf_agents.specs import tensor_spec
from tf_agents.train import actor
from tf_agents.train.utils import train_utils

from smart_replay import errors
from smart_replay.apps import progress as progress_lib
from smart_replay.apps.envs import factory as env_factory
from smart_replay.apps.policies import factory as policy_factory
from smart_replay.config import record
from smart_replay.manager import facade as manager_lib
from smart_replay.tools import provenance
from smart_replay.utils import checks
from smart_replay.writing import counters

# Where buffers of a name are found; importable from here too.
find_buffers = provenance.find_buffers


@dataclasses.dataclass
class PopulateResult:
  """What a populate call left on disk.

  Attributes:
    buffer_dir: the starter buffer's directory.
    checkpoint: the newest checkpoint folder (None if nothing was saved).
    steps: env steps collected in total (see `smart_replay.writing.counters`:
      boundary steps excluded), including earlier sessions of a resumed
      buffer.
    total_steps: env steps requested (`steps_per_run * num_runs`).
    episodes: finished episodes in total.
    runs: runs completed in total.
    items: items in the buffer's table (`num_frames()`).
    interrupted: True if a stop was requested before the total was reached.
    provenance: path of the provenance file.
  """
  buffer_dir: str
  checkpoint: Optional[str]
  steps: int
  total_steps: int
  episodes: int
  runs: int
  items: int
  interrupted: bool
  provenance: str

  def summary(self) -> str:
    """What the populate command prints, in the words inspect uses.

    The counts are defined in `smart_replay.writing.counters`; the second line
    is `provenance.collection_state`, as inspect prints it.

    Returns:
      'Populated DIR: N env steps, E finished episodes, I items, R runs.'
      or, for an interrupted run, 'Interrupted: collected N env steps, ...
      in DIR.', then 'complete: ...' / 'interrupted: N of T requested env
      steps (...)', the checkpoint and the provenance file, one a line.
    """
    counts = counters.format_counts(env_steps=self.steps,
                                    episodes=self.episodes, items=self.items)
    state = provenance.collection_state({
        'env_steps': self.steps, 'requested_env_steps': self.total_steps,
        'complete': self.steps >= self.total_steps})
    runs = f"{self.runs} run{'' if self.runs == 1 else 's'}"
    head = (f'Interrupted: collected {counts}, {runs} in {self.buffer_dir}.'
            if self.interrupted else
            f'Populated {self.buffer_dir}: {counts}, {runs}.')
    return (f'{head}\n  {state}\n  checkpoint: {self.checkpoint}\n'
            f'  provenance: {self.provenance}')


def derived_seed(seed: int, session: int) -> int:
  """Returns the seed for session `session` of a buffer seeded with `seed`.

  A resumed session must not replay the first session's random stream.

  Args:
    seed: the user's seed.
    session: 0 for the first session, 1 for the first resume, ...

  Returns:
    A non-negative 31-bit seed (equal to `seed` for session 0).
  """
  if session == 0:
    return seed
  return int(np.random.SeedSequence([seed, session]).generate_state(1)[0]
             & 0x7FFFFFFF)


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat()


@gin.configurable(denylist=['stop_requested'])
def populate_starter_buffer(
    *, buffer_name: str, output_dir: str = './starter_buffers',
    capacity: int = 50_000, steps_per_run: int = 288, num_runs: int = 10,
    sequence_length: int = 2, env: str = env_factory.THERMAL,
    policy: str = 'baseline', seed: int = 0, overwrite: bool = False,
    resume: bool = False, checkpoint_every_run: bool = True,
    show_progress: bool = True, log_every_s: float = 10.0,
    stop_requested: Optional[Callable[[], bool]] = None) -> PopulateResult:
  """Fills (or continues) a starter buffer with a baseline policy's experience.

  The buffer lives in `output_dir/<buffer_name>_seq<L>_<total>steps/` and is
  checkpointed through `ReplayBufferManager` after every run (if
  `checkpoint_every_run`) and at the end; `provenance.json` beside the
  checkpoints records the env, policy, seed, gin config, counts, spec,
  versions and timings of every session.

  Args:
    buffer_name: a plain name (letters, digits, '.', '_', '-').
    output_dir: where buffer directories are created.
    capacity: buffer capacity in items.
    steps_per_run: policy steps per Actor run (boundary steps not counted).
    num_runs: runs; the total is `steps_per_run * num_runs` steps.
    sequence_length: steps per item.
    env: 'thermal', 'gymnasium:<id>', 'atari:<Game>' or 'gym:<id>' (see
      `envs.factory.make_environment`).
    policy: 'baseline', 'schedule', 'scripted', 'random' or 'saved:<dir>'
      (see `policies.factory.make_policy`).
    seed: seed of the environment and of random policies.
    overwrite: replace an existing buffer of the same name.
    resume: continue an existing buffer up to the total (counting what it
      already holds); starts a new one if there is none.
    checkpoint_every_run: checkpoint after each run, not only at the end.
    show_progress: draw a tqdm progress bar; otherwise log a line every
      `log_every_s` seconds.
    log_every_s: seconds between progress log lines without a bar.
    stop_requested: polled after every step; when it returns True, collection
      stops, a final checkpoint is written and the result says `interrupted`.

  Returns:
    A `PopulateResult`.

  Raises:
    ValueError: on a bad argument (names it and its value), or if both
      `overwrite` and `resume` are set.
    CheckpointExistsError: if the buffer exists and neither `overwrite` nor
      `resume` is set.
    ManifestMismatchError: if `resume` finds a buffer made with another spec,
      capacity or sequence length.
    PrefillWouldBlockError: if a table's rate limiter would block the writes
      (nothing samples while populating); the message says how to fix it.
  """
  provenance.validate_buffer_name(buffer_name)
  for name, value in (('capacity', capacity), ('steps_per_run', steps_per_run),
                      ('num_runs', num_runs),
                      ('sequence_length', sequence_length)):
    checks.positive(name, value, integer=True)
  if overwrite and resume:
    raise ValueError('overwrite and resume exclude each other: resume keeps '
                     'the existing buffer, overwrite replaces it.')
  total = steps_per_run * num_runs
  output_dir = os.path.abspath(output_dir)
  buffer_dir = os.path.join(output_dir, provenance.buffer_dir_name(
      buffer_name, sequence_length, total))
  environment = env_factory.make_environment(env, seed=seed)
  baseline = policy_factory.make_policy(policy, env=environment, seed=seed)
  renamed_from = _find_buffer_to_resume(output_dir, buffer_name,
                                        sequence_length, buffer_dir) \
      if resume else None
  try:
    result = _populate(
        buffer_dir=buffer_dir, buffer_name=buffer_name, total=total,
        environment=environment, baseline=baseline, capacity=capacity,
        steps_per_run=steps_per_run, num_runs=num_runs,
        sequence_length=sequence_length, env=env, policy=policy, seed=seed,
        overwrite=overwrite, resume=resume,
        checkpoint_every_run=checkpoint_every_run,
        show_progress=show_progress, log_every_s=log_every_s,
        stop_requested=stop_requested)
  except BaseException:
    if renamed_from and not os.path.exists(renamed_from):
      os.rename(buffer_dir, renamed_from)  # Leave the buffer where it was.
    raise
  return result


def _find_buffer_to_resume(output_dir, buffer_name, sequence_length,
                           buffer_dir) -> Optional[str]:
  """Finds the buffer `resume=True` means; renames it for a new total.

  Returns:
    Its old path if it was renamed to `buffer_dir`, else None.
  """
  found = find_buffers(output_dir, buffer_name, sequence_length)
  if len(found) > 1:
    raise ValueError(
        f'cannot resume: {len(found)} buffers named {buffer_name!r} '
        f'with sequence_length={sequence_length} exist: {found}. Keep one.')
  if not found:
    logging.warning('Resuming: no buffer named %r with sequence_length=%d in '
                    '%s yet; starting a new one.', buffer_name,
                    sequence_length, output_dir)
    return None
  if found[0] == buffer_dir:
    return None
  logging.info('Resuming %s up to the new total: renaming it to %s.',
               found[0], buffer_dir)
  os.rename(found[0], buffer_dir)
  return found[0]


def _populate(*, buffer_dir, buffer_name, total, environment, baseline,
              capacity, steps_per_run, num_runs, sequence_length, env, policy,
              seed, overwrite, resume, checkpoint_every_run, show_progress,
              log_every_s, stop_requested) -> PopulateResult:
  """The body of `populate_starter_buffer`, once the buffer is located."""
  provenance_path = os.path.join(buffer_dir, provenance.PROVENANCE_NAME)
  identity = {'env': env, 'policy': policy,
              'policy_class': type(baseline).__name__}
  manager = manager_lib.ReplayBufferManager(
      tensor_spec.from_spec(baseline.collect_data_spec), capacity=capacity,
      checkpoint_dir=buffer_dir, sequence_length=sequence_length)
  with manager:
    state = {'steps': 0, 'episodes': 0, 'runs': 0, 'total_steps': total,
             **identity}
    sessions = []
    if manager.existing_checkpoints() and not overwrite:
      if not resume:
        raise errors.CheckpointExistsError(
            f'starter buffer {buffer_dir} already exists; pass resume=True '
            f'to continue it up to {total} steps, or overwrite=True to '
            'replace it.')
      _, observer = manager.load_replay_buffer()
      stored = manager.loaded_manifest.get('extra', {}).get('populate', {})
      mismatched = [(key, stored.get(key), value)
                    for key, value in identity.items()
                    if stored.get(key) != value]
      if mismatched:
        raise ValueError(
            f'cannot resume {buffer_dir}: it was collected with other '
            'settings:\n'
            + record.format_differences(mismatched, 'buffer', 'now')
            + '\nResume with the same env and policy, or pass overwrite=True.')
      state.update(stored, total_steps=total)
      if total > state['steps']:
        manager.check_prefill(total - state['steps'])
      sessions = provenance.read_sessions(buffer_dir)
      seed_now = derived_seed(seed, len(sessions))
      # A new session must not replay the first one's random stream.
      environment = env_factory.make_environment(env, seed=seed_now)
      baseline = policy_factory.make_policy(policy, env=environment,
                                            seed=seed_now)
      logging.info('Resuming %s at %d/%d steps (session %d, seed %d).',
                   buffer_dir, state['steps'], total, len(sessions), seed_now)
    else:
      seed_now = seed
      # Checked before anything is created or replaced.
      manager.check_prefill(total)
      _, observer = manager.create_replay_buffer(overwrite=overwrite)

    if total - state['steps'] > capacity - manager.num_frames():
      logging.warning(
          'About %d more items will be written but only %d of capacity %d '
          'are free: the oldest items will be evicted once the buffer is '
          'full.', total - state['steps'], capacity - manager.num_frames(),
          capacity)
    session = {'seed': seed_now, 'started_utc': _now(),
               'steps_before': state['steps'], 'resumed': bool(sessions),
               'gin_config': gin.operative_config_str(), **identity}
    started = time.monotonic()
    progress = progress_lib.Progress(
        observer, total=total, done=state['steps'], episodes=state['episodes'],
        label=buffer_name, manager=manager, capacity=capacity,
        show_progress=show_progress, log_every_s=log_every_s,
        stop_requested=stop_requested)
    checkpoint = (manager.existing_checkpoints() or [None])[-1]
    interrupted = False
    # One Actor for the whole session: a new Actor resets the environment,
    # which would cut an episode. The step observer ends the last run at the
    # exact total.
    collect = actor.Actor(environment, baseline,
                          train_utils.create_train_step(),
                          steps_per_run=steps_per_run, observers=[progress])
    def record_session():
      session.update(finished_utc=_now(),
                     seconds=round(time.monotonic() - started, 3),
                     steps=state['steps'] - session['steps_before'],
                     checkpoint=checkpoint)
      provenance.write_provenance(
          provenance_path, manager, sessions + [session], state=state,
          buffer_name=buffer_name, seed=seed, capacity=capacity,
          sequence_length=sequence_length, steps_per_run=steps_per_run,
          num_runs=num_runs, interrupted=interrupted)

    try:
      while state['steps'] < total:
        if stop_requested is not None and stop_requested():
          # Asked between runs: the last checkpoint is current; only the
          # provenance must say the run was interrupted.
          interrupted = True
          record_session()
          break
        try:
          collect.run()
        except progress_lib.StopCollection:
          interrupted = True
        except progress_lib.TotalReached:
          pass
        state['steps'], state['episodes'] = progress.steps, progress.episodes
        state['runs'] = state['steps'] // steps_per_run
        progress.refresh()  # Short runs may not reach the periodic check.
        if checkpoint_every_run or interrupted or state['steps'] >= total:
          checkpoint = manager.checkpoint(extra={'populate': dict(state)})
          record_session()
        if interrupted:
          break
    finally:
      progress.close()
    stats = manager.stats()
    if stats['short_episodes']:
      logging.warning(
          '%d episodes (%d steps) were shorter than sequence_length=%d and '
          'made no item; lower sequence_length to keep them.',
          stats['short_episodes'], stats['short_episode_steps'],
          sequence_length)
    items = manager.num_frames()
  return PopulateResult(
      buffer_dir=buffer_dir, checkpoint=checkpoint, steps=state['steps'],
      total_steps=total, episodes=state['episodes'], runs=state['runs'],
      items=items, interrupted=interrupted, provenance=provenance_path)
