"""The policy variables table: the weights a learner pushes, collectors pull.

TF-Agents' distributed examples (`experimental/distributed/examples/sac`)
keep the learner's policy weights in a Reverb table beside the replay table,
read and written by `ReverbVariableContainer`: a table named 'variables',
uniform, FIFO, `max_size=1`, `MinSize(1)`, never emptied by sampling, whose
signature is `{'policy_variables': [one spec per variable of the collect
policy], 'train_step': int64[]}`; an item is one step, one column per
flattened leaf (the container refuses a table without a signature or with
another `max_size`).

`VariablesTable` describes that table for a served buffer. It is not a
replay table: it is no `TableConfig`, so nothing that describes the buffer
(its config, insert and loss counts, `stats()` tables, metrics) counts it;
a checkpoint's manifest lists it under its own key (`to_manifest`), and a
server restarted from the checkpoint serves the last weights at once.
"""

import dataclasses
from typing import Any, Dict, List, Sequence, Tuple

import reverb
import tensorflow as tf

from smart_replay.spec import specs

POLICY_KEY = 'policy_variables'  # As `ReverbVariableContainer` names them.
TRAIN_STEP_KEY = 'train_step'
DEFAULT_NAME = 'variables'
TRAIN_STEP_SPEC = tf.TensorSpec([], tf.int64)  # `train_utils.create_train_step`


def signature_of(policy_variables: Sequence[Any]) -> Dict[str, Any]:
  """The variables table's signature for a policy's variables.

  Args:
    policy_variables: the collect policy's variables (`policy.variables()`,
      a loaded policy's `model_variables`), or their `tf.TensorSpec`s.

  Returns:
    `{'policy_variables': [tf.TensorSpec per variable], 'train_step':
    tf.TensorSpec([], tf.int64)}`, as TF-Agents' example server builds it.

  Raises:
    ValueError: a variable has a shape that is not fully known.
  """
  leaves = []
  for index, variable in enumerate(list(policy_variables)):
    shape = tf.TensorShape(variable.shape)
    if not shape.is_fully_defined():
      name = getattr(variable, 'name', None)
      raise ValueError(f'policy_variables[{index}] ({name}) has shape '
                       f'{shape}; a Reverb signature needs every dimension.')
    leaves.append(tf.TensorSpec(shape, tf.as_dtype(variable.dtype)))
  return {POLICY_KEY: leaves, TRAIN_STEP_KEY: TRAIN_STEP_SPEC}


@dataclasses.dataclass(frozen=True)
class VariablesTable:
  """The table of the policy weights beside a served buffer.

  Attributes:
    signature: `{'policy_variables': [tf.TensorSpec, ...], 'train_step':
      tf.TensorSpec([], tf.int64)}` (`signature_of`).
    name: the table's name ('variables', as TF-Agents' container expects).

  Raises:
    ValueError: on a bad field; the message names it and its value.
  """

  signature: Any
  name: str = DEFAULT_NAME

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f'VariablesTable.name must be a non-empty string, got '
                       f'{self.name!r}')
    signature = self.signature
    if (not isinstance(signature, dict) or
        set(signature) != {POLICY_KEY, TRAIN_STEP_KEY}):
      raise ValueError(
          f'VariablesTable.signature must be a dict of {POLICY_KEY!r} and '
          f'{TRAIN_STEP_KEY!r} (see signature_of), got '
          f'{type(signature).__name__} {_keys(signature)}')
    step = signature[TRAIN_STEP_KEY]
    if (not isinstance(step, tf.TensorSpec) or step.dtype != tf.int64 or
        step.shape != []):
      raise ValueError(f'VariablesTable.signature[{TRAIN_STEP_KEY!r}] must be '
                       f'tf.TensorSpec([], tf.int64), got {step!r}')
    leaves = signature[POLICY_KEY]
    if not isinstance(leaves, (list, tuple)) or not all(
        isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined()
        for s in leaves):
      raise ValueError(
          f'VariablesTable.signature[{POLICY_KEY!r}] must be a list of '
          f'tf.TensorSpec of known shapes, got {leaves!r}')

  @property
  def num_leaves(self) -> int:
    """Tensors per item: the policy's variables and the train step."""
    return len(self.signature[POLICY_KEY]) + 1

  def reverb_table(self) -> reverb.Table:
    """The `reverb.Table`: uniform, FIFO, `max_size=1`, `MinSize(1)`.

    Returns:
      The table TF-Agents' `ReverbVariableContainer` accepts.
    """
    return reverb.Table(
        name=self.name, sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(), max_size=1, max_times_sampled=0,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature=self.signature)

  def to_manifest(self) -> Dict[str, Any]:
    """What a checkpoint's manifest records of it.

    Returns:
      `{'name', 'signature': specs.spec_to_json(signature)}` (JSON).
    """
    return {'name': self.name,
            'signature': specs.spec_to_json(self.signature)}

  @classmethod
  def from_manifest(cls, stored: Dict[str, Any]) -> 'VariablesTable':
    """The table a manifest recorded (`to_manifest`).

    Args:
      stored: the manifest's `variables` entry.

    Returns:
      The `VariablesTable`.

    Raises:
      ValueError: the entry is not one `to_manifest` wrote.
    """
    if not isinstance(stored, dict) or {'name', 'signature'} - set(stored):
      raise ValueError(f"a manifest's variables entry must hold 'name' and "
                       f"'signature', got {_keys(stored)}")
    signature = specs.spec_from_json(stored['signature'])
    signature = {POLICY_KEY: list(signature[POLICY_KEY]),
                 TRAIN_STEP_KEY: signature[TRAIN_STEP_KEY]}
    return cls(signature=signature, name=stored['name'])

  def differences(self, stored: Dict[str, Any]) -> List[Tuple[str, str, str]]:
    """How this table differs from a manifest's (`to_manifest`).

    Args:
      stored: the manifest's `variables` entry.

    Returns:
      `(field, stored, requested)` per difference: the name, then each
      tensor of the signature (dtype and shape); empty when they match.
    """
    diffs = []
    if stored.get('name') != self.name:
      diffs.append(('variables/name', repr(stored.get('name')),
                    repr(self.name)))
    requested = self.to_manifest()['signature']['leaves']
    diffs += specs.diff_spec_leaves(stored['signature']['leaves'], requested,
                                    prefix='variables/signature')
    return diffs


def _keys(value: Any) -> Any:
  return sorted(value) if isinstance(value, dict) else value
