"""What `train_from_starter` checks before it starts anything.

The starter's environment, spec and limiters, and the starter mode with its
fraction schedule: each raises with the argument, its value and what was
expected, before a server starts or a directory changes.
"""

from typing import Optional

from smart_replay import errors
from smart_replay.sampling import fraction_schedule as schedule_lib
from smart_replay.spec import specs
from smart_replay.tools import provenance

MODES = ('copy', 'mix', 'none')  # How the starter's data is used.


def starter_env(starter_dir: str) -> str:
  """The environment a starter was collected in, from its provenance.

  Args:
    starter_dir: the starter buffer.

  Returns:
    The environment name.

  Raises:
    ValueError: if the provenance is missing or names none.
  """
  try:
    return provenance.read_provenance(starter_dir)['env']
  except (OSError, ValueError, KeyError) as e:
    raise ValueError(
        f'cannot tell which environment {starter_dir} was collected in: its '
        f'{provenance.PROVENANCE_NAME} is missing or has no "env" ({e}). Pass '
        'env= explicitly.') from None


def fraction_schedule(mode: str, initial: Optional[float],
                      final: Optional[float], steps: Optional[int], kind: str
                      ) -> Optional[schedule_lib.FractionSchedule]:
  """The starter's share of each batch for `mode` ('mix'), else None.

  Args:
    mode: 'copy', 'mix' or 'none'.
    initial: the share at train step 0 (None: 0.5).
    final: the share to anneal to, or None.
    steps: train steps of the annealing, or None.
    kind: 'linear' or 'exponential'.

  Returns:
    A `FractionSchedule` for 'mix', None otherwise.

  Raises:
    ValueError: on an unknown mode, a fraction given outside 'mix', or an
      invalid schedule (names the argument and its value).
  """
  if mode not in MODES:
    raise ValueError(f'starter_mode must be one of {MODES}, got {mode!r}.')
  given = {'starter_fraction': initial, 'starter_fraction_final': final,
           'starter_fraction_steps': steps}
  if mode != 'mix':
    set_ = ', '.join(f'{k}={v}' for k, v in given.items() if v is not None)
    if set_:
      raise ValueError(f"{set_}: only for starter_mode='mix', got "
                       f'starter_mode={mode!r}.')
    return None
  try:
    return schedule_lib.FractionSchedule(
        initial=0.5 if initial is None else initial, final=final, steps=steps,
        kind=kind)
  except ValueError as e:
    raise ValueError(f'starter_fraction={initial}, starter_fraction_final='
                     f'{final}, starter_fraction_steps={steps}, '
                     f'starter_fraction_schedule={kind!r}: {e}') from None



def check_no_ratio_limiter(starter_dir, table_configs, collect_steps,
                           samples) -> None:
  """Raises WouldBlockError for limiters this alternating loop would stall.

  The loop collects, then trains, in turns: nothing samples while the actor
  runs and nothing inserts while the learner runs, and the loop itself fixes
  the ratio (`samples` per `collect_steps` steps). A samples_per_insert or
  queue limiter on top drifts against it (an episode's steps make fewer items
  than steps) until one side waits for the other, which never comes.

  Args:
    starter_dir: the starter (for the message).
    table_configs: the buffer's tables.
    collect_steps: env steps per collect phase.
    samples: items sampled per train phase.

  Raises:
    WouldBlockError: naming the limited tables.
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


def check_spec(starter_dir, starter_spec, agent_spec) -> None:
  """Raises ManifestMismatchError if the starter cannot feed the agent.

  Dtypes and shapes must match everywhere; bounds only for the action (DQN
  sizes its Q-head from them).

  Args:
    starter_dir: the starter (for the message).
    starter_spec: the starter's data spec.
    agent_spec: the agent's `collect_data_spec`.

  Raises:
    ManifestMismatchError: listing each difference.
  """
  diffs = specs.diff_specs(starter_spec, agent_spec, bounds_for=('action',))
  if diffs:
    raise errors.ManifestMismatchError(
        f'the starter buffer {starter_dir} does not match the agent\'s '
        f'collect_data_spec ({len(diffs)} difference(s)):\n'
        + '\n'.join(f'  {field}: starter {a}, agent {b}'
                    for field, a, b in diffs), diffs)
