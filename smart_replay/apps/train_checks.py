"""Whether a starter buffer can feed this training run.

`train_from_starter`'s arguments check themselves (`train_config`); what
depends on the starter is checked here, from its manifest and provenance,
before its server starts or a directory changes: the environment it was
collected in, its spec against the agent's, its rate limiters against the
alternating loop, and its sequence length against the 2-step transitions the
agents train on. Each error names the starter, the value and what was
expected.
"""

from typing import Any

from smart_replay import errors
from smart_replay.spec import specs
from smart_replay.tools import provenance


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


def check_sequence_length(starter_dir, sequence_length: int) -> None:
  """Raises ValueError unless the starter's items hold 2-step transitions.

  Args:
    starter_dir: the starter (for the message).
    sequence_length: its steps per item.

  Raises:
    ValueError: if `sequence_length` is odd.
  """
  if sequence_length % 2:
    raise ValueError(
        f'the starter {starter_dir} has sequence_length={sequence_length}; '
        'DQN and SAC train on 2-step transitions, so it must be even.')


def check_starter(starter_dir, manager: Any, agent_spec, *,
                  collect_steps: int, samples: int) -> None:
  """Runs every check of this module on a starter's (unstarted) manager.

  Args:
    starter_dir: the starter (for the messages).
    manager: a `ReplayBufferManager` configured from the starter's manifest.
    agent_spec: the agent's `collect_data_spec`.
    collect_steps: env steps per collect phase.
    samples: items sampled per train phase.

  Raises:
    ManifestMismatchError: see `check_spec`.
    WouldBlockError: see `check_no_ratio_limiter`.
    ValueError: see `check_sequence_length`.
  """
  check_spec(starter_dir, manager.data_spec, agent_spec)
  check_no_ratio_limiter(starter_dir, manager.table_configs, collect_steps,
                         samples)
  check_sequence_length(starter_dir, manager.sequence_length)
