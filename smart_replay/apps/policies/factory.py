"""Building the baseline policy that populates a buffer."""

import os

from absl import logging
import gin
from tf_agents.environments import py_environment
from tf_agents.policies import py_policy
from tf_agents.policies import random_py_policy

from smart_replay.apps.envs import thermal
from smart_replay.apps.policies import cartpole
from smart_replay.apps.policies import thermostat
from smart_replay.spec import specs

SAVED_PREFIX = 'saved:'
# Gym ids with a scripted baseline.
SCRIPTED = {
    'CartPole-v0': cartpole.CartPoleBalancePolicy,
    'CartPole-v1': cartpole.CartPoleBalancePolicy,
}
KINDS = ('baseline', 'schedule', 'scripted', 'random', SAVED_PREFIX + '<dir>')


def _gym_id(env: py_environment.PyEnvironment):
  gym_env = getattr(env, 'gym', None)
  spec = getattr(getattr(gym_env, 'unwrapped', gym_env), 'spec', None) or \
      getattr(gym_env, 'spec', None)
  return getattr(spec, 'id', None)


def _load_saved_policy(path: str, env: py_environment.PyEnvironment
                       ) -> py_policy.PyPolicy:
  """Loads a policy_saver directory with its own specs; checks it fits env."""
  from tf_agents.policies import py_tf_eager_policy  # pylint: disable=g-import-not-at-top
  if os.path.isfile(os.path.join(path, 'policy_specs.pbtxt')):
    # Its own specs carry policy_info and state, which the env's cannot.
    policy = py_tf_eager_policy.SavedModelPyTFEagerPolicy(
        path, load_specs_from_pbtxt=True)
  else:
    logging.warning('%s has no policy_specs.pbtxt; assuming the environment\'s '
                    'specs and no policy_info.', path)
    policy = py_tf_eager_policy.SavedModelPyTFEagerPolicy(
        path, env.time_step_spec(), env.action_spec())
  diffs = []
  for field, wanted, got in (
      ('time_step', env.time_step_spec(), policy.time_step_spec),
      ('action', env.action_spec(), policy.action_spec)):
    diffs += specs.diff_specs(wanted, got, prefix=field)
  if diffs:
    raise ValueError(
        f'the saved policy at {path} does not fit this environment:\n'
        + '\n'.join(f'  {field}: environment {a}, policy {b}'
                     for field, a, b in diffs))
  return policy


@gin.configurable
def saved_policy_kind(path: str) -> str:
  """Returns `'saved:<path>'`, the policy kind of a saved policy directory.

  For gin files: `populate_starter_buffer.policy = @saved_policy_kind()` with
  `saved_policy_kind.path = %SAVED_POLICY_DIR`.

  Args:
    path: a `policy_saver` SavedModel directory.

  Returns:
    The policy kind string for `make_policy`.
  """
  return SAVED_PREFIX + path


@gin.configurable
def make_policy(kind: str = 'baseline', *, env: py_environment.PyEnvironment,
                seed: int = 0) -> py_policy.PyPolicy:
  """Creates the policy that collects a starter buffer.

  Args:
    kind: 'baseline' (the environment's own baseline: the schedule policy for
      the thermal environment, a scripted policy for Gym ids that have one,
      else random), 'schedule', 'scripted', 'random', or 'saved:<dir>' for a
      TF-Agents `policy_saver` SavedModel directory.
    env: the environment the policy acts in.
    seed: seed of a random policy.

  Returns:
    A `PyPolicy` for unbatched time steps of `env`.

  Raises:
    ValueError: if `kind` is unknown, does not fit `env`, or the saved policy
      directory does not exist; the message names the value.
  """
  thermal_env = isinstance(env, thermal.ThermalZoneEnv)
  if kind == 'baseline':
    kind = ('schedule' if thermal_env else
            'scripted' if _gym_id(env) in SCRIPTED else 'random')
  if kind == 'random':
    return random_py_policy.RandomPyPolicy(env.time_step_spec(),
                                           env.action_spec(), seed=seed)
  if kind == 'schedule':
    if not thermal_env:
      raise ValueError(f"policy 'schedule' needs the thermal environment, not "
                       f'{type(env).__name__}.')
    return thermostat.SchedulePolicy(env.time_step_spec(), env.action_spec())
  if kind == 'scripted':
    gym_id = _gym_id(env)
    if gym_id not in SCRIPTED:
      raise ValueError(f"no scripted policy for {gym_id or type(env).__name__};"
                       f' scripted policies exist for {sorted(SCRIPTED)}.')
    return SCRIPTED[gym_id](env.time_step_spec(), env.action_spec())
  if isinstance(kind, str) and kind.startswith(SAVED_PREFIX):
    path = kind[len(SAVED_PREFIX):]
    if not os.path.isfile(os.path.join(path, 'saved_model.pb')):
      raise ValueError(f'saved policy directory {path!r} has no saved_model.pb;'
                       ' expected a directory written by tf_agents '
                       'policy_saver.PolicySaver.save().')
    return _load_saved_policy(path, env)
  raise ValueError(f'unknown policy {kind!r}; expected one of {KINDS}.')
