"""Names and units of known environments' fields, for the figures.

Keyed by the `env` a buffer's `provenance.json` records. Only data: the
figures of a buffer from any other environment label its dimensions
`observation[i]` / `action[i]`.
"""

from typing import Dict, List, NamedTuple, Optional, Sequence


class Labels(NamedTuple):
  """What the dimensions of an environment's observation and action mean.

  Attributes:
    observation: `(name, unit)` per flattened observation dimension.
    action: `(name, unit)` per flattened action dimension.
    action_values: names of the values of a discrete action, or None.
  """
  observation: Sequence[tuple]
  action: Sequence[tuple]
  action_values: Optional[Dict[int, str]] = None


_CARTPOLE = Labels(
    observation=(('cart position', 'm'), ('cart velocity', 'm/s'),
                 ('pole angle', 'rad'), ('pole angular velocity', 'rad/s')),
    action=(('action', ''),),
    action_values={0: 'push left', 1: 'push right'})

KNOWN: Dict[str, Labels] = {
    # smart_replay.apps.envs.thermal.OBSERVATION_FIELDS, and its action.
    'thermal': Labels(
        observation=(('indoor temperature', '°C'),
                     ('outdoor temperature', '°C'),
                     ('hour of day, sine', ''), ('hour of day, cosine', ''),
                     ('occupied', '0/1')),
        action=(('HVAC power u', 'fraction of P_max; > 0 heats'),)),
    'gymnasium:CartPole-v1': _CARTPOLE,
    'gym:CartPole-v1': _CARTPOLE,
    'gymnasium:CartPole-v0': _CARTPOLE,
    'gym:CartPole-v0': _CARTPOLE,
}


def for_env(env: Optional[str]) -> Optional[Labels]:
  """The labels of a known environment.

  Args:
    env: the provenance's `env` (e.g. 'thermal'), or None.

  Returns:
    Its `Labels`, or None for an unknown environment.
  """
  return KNOWN.get(env) if env else None


def axis_label(names: Optional[Sequence[tuple]], index: int,
               default: str) -> str:
  """`'name (unit)'` of dimension `index`, or `default`.

  Args:
    names: `(name, unit)` pairs, or None.
    index: the dimension.
    default: used when `names` does not cover `index`.

  Returns:
    The label.
  """
  if names is None or index >= len(names):
    return default
  name, unit = names[index]
  return f'{name} ({unit})' if unit else name


def value_names(labels: Optional[Labels], values: List[int]) -> List[str]:
  """Names of discrete action values: `'1: push right'`, else `'1'`.

  Args:
    labels: the environment's labels, or None.
    values: the action values shown.

  Returns:
    One tick label per value.
  """
  known = (labels.action_values or {}) if labels else {}
  return [f'{v}: {known[v]}' if v in known else str(v) for v in values]
