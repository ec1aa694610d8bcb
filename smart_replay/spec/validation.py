"""Checks an observer's arguments, and every step it writes, against the spec.

A step of the wrong dtype or shape that reaches a Reverb writer without
validation is stored and poisons the tables until sampling fails, far from
the step that caused it. `StepValidator` checks each step before
anything reaches a writer and raises `TrajectorySpecError`, naming the field's
path, the offending values and what was expected; the observer then writes
nothing of the step (with `num_envs`, no environment's step of the call). It
checks

* the structure, including a namedtuple's fields and a mapping's keys (a dict
  flattens by sorted key, so its values would be stored under other fields);
* each field's dtype and shape (with an outer dimension of `num_envs`);
* the values the observer relies on, always: step types (`step_type`,
  `next_step_type`) must be FIRST=0, MID=1 or LAST=2, since the observer cuts
  episodes by them, and integer fields must lie within their bounded spec's
  bounds (an integer action outside them cannot be a valid action);
* floating fields, as configured: NaN/+-Inf (`non_finite`, 'error' by default)
  and finite values outside a bounded spec's bounds (`float_bounds`, 'warn' by
  default: specs of continuous observations are often loose) are refused
  ('error'), written with a warning logged once per field ('warn'; the field
  is not checked for it any more) or written silently ('allow').

It runs on every step, so the value checks are precomputed per field as the
cheapest test that covers them (`value_checks.ValueChecks`); only a step that
fails its test is examined further, to name the offending values.
"""

import collections.abc
import math
from typing import Any, List, Optional

import numpy as np
import tree

from smart_replay import errors
from smart_replay.spec import specs
from smart_replay.spec import structure
from smart_replay.spec import value_checks
# The test modes of the hot loop, as globals of this module; VALUE_POLICIES
# stays importable from here.
from smart_replay.spec.value_checks import ELEMENTWISE, SCALAR
from smart_replay.spec.value_checks import SMALL, SMALL_FLOAT, STEP_TYPES
from smart_replay.spec.value_checks import UNIFORM, VALUE_POLICIES


_MINIMUM, _MAXIMUM = np.minimum.reduce, np.maximum.reduce
_SEQUENCES = (tuple, list)
_ERROR_HINTS = {
    None: '',
    'non_finite': " (non_finite='error'; an observer made with "
                  "non_finite='warn' or 'allow' stores NaN/Inf)",
    'float_bounds': " (float_bounds='error'; an observer made with "
                    "float_bounds='warn' or 'allow' stores such values)"}


def _as_array(value):
  return value.numpy() if hasattr(value, 'numpy') else np.asarray(value)


def check_optional_count(name: str, value: Optional[int],
                         none_means: str) -> None:
  """Checks an argument that is None or a positive integer.

  Args:
    name: the argument's name, for the message.
    value: its value.
    none_means: what None stands for, for the message (e.g. 'automatic').

  Raises:
    ValueError: unless `value` is None or an integer >= 1 (not a bool).
  """
  if value is not None and (isinstance(value, bool) or
                            not isinstance(value, int) or value < 1):
    raise ValueError(f'{name} must be None ({none_means}) or an integer >= 1, '
                     f'got {value!r}.')


class StepValidator:
  """Checks steps against a data spec; a call returns a step's fields.

  Made once per observer (the checks are precomputed from the spec), then
  called on every step before it is written.

  Args:
    data_spec: the spec of one step, a TF-Agents `Trajectory` of
      `tf.TensorSpec` with every dimension known (e.g.
      `agent.collect_data_spec`).
    num_envs: None for unbatched steps; otherwise every step holds this many
      environments' steps, batched on the outer dimension.
    non_finite: what a step holding NaN or +-Inf in a floating field gets:
      'error' (the default) refuses it; 'warn' accepts it and logs a warning,
      once per field; 'allow' accepts it silently.
    float_bounds: what a finite value of a floating field outside its
      `BoundedTensorSpec` bounds gets: 'error', 'warn' (the default) or
      'allow', as for `non_finite`.

  Raises:
    ValueError: on a bad argument; the message names it and its value.
  """

  def __init__(self, data_spec: Any, *, num_envs: Optional[int] = None,
               non_finite: str = 'error', float_bounds: str = 'warn'):
    check_optional_count('num_envs', num_envs, 'unbatched')
    for name, value in (('non_finite', non_finite),
                        ('float_bounds', float_bounds)):
      if not isinstance(value, str) or value not in VALUE_POLICIES:
        raise ValueError(f'{name} must be one of {VALUE_POLICIES}, got '
                         f'{value!r}.')
    specs.validate_trajectory_spec(data_spec)
    for leaf in specs.flatten_spec(data_spec):
      if None in leaf.shape:
        raise ValueError(
            f'data_spec field {leaf.path!r} has shape {leaf.shape} with an '
            'unknown dimension; Reverb\'s writer fixes each field\'s shape at '
            'its first step, so every dimension must be known (pad variable-'
            'size fields to a fixed size).')
    self._data_spec = data_spec
    self._leaves = specs.flatten_spec(data_spec)
    self._dtypes = [np.dtype(leaf.dtype) for leaf in self._leaves]
    self._shapes = [tuple(leaf.shape) for leaf in self._leaves]
    self._num_envs = num_envs
    paths = [leaf.path for leaf in self._leaves]
    self._values = value_checks.ValueChecks(
        self._leaves, num_envs=num_envs, non_finite=non_finite,
        float_bounds=float_bounds,
        step_types={paths.index('step_type'), paths.index('next_step_type')})
    self._checks = self._values.checks
    # Where a step must hold the spec's keys in its flattening order (tree's
    # own check ignores keys): (steps, keys, key set, is a mapping).
    self._keyed = [(steps, keys, frozenset(keys), is_mapping)
                   for steps, keys, is_mapping in structure.keyed_nodes(data_spec)]

  def __call__(self, trajectory: Any) -> List[np.ndarray]:
    """Returns the step's fields, flat, if they match the data spec.

    Checks the structure, then each field's dtype and shape, then its values
    (`value_checks`); logs the warnings of an accepted step.

    Args:
      trajectory: one step matching the data spec: unbatched, or with an
        outer dimension of `num_envs`; numpy arrays, tensors or Python values.

    Returns:
      The step's fields as numpy arrays, in the order of
      `specs.flatten_spec(data_spec)`.

    Raises:
      TrajectorySpecError: naming the field, the offending values and what
        was expected, unless `trajectory` matches; nothing of the step may be
        written then.
    """
    try:
      tree.assert_same_structure(self._data_spec, trajectory, check_types=False)
      # A namedtuple needs the spec's keys in flattening order (a dict
      # flattens by sorted key), a mapping the same keys; a plain tuple or
      # list is positional. (Tree passed: any other node is a mapping.)
      for steps, keys, key_set, is_mapping in self._keyed:
        node = trajectory
        for key, index in steps:
          node = node[index] if isinstance(node, _SEQUENCES) else node[key]
        if isinstance(node, _SEQUENCES):
          if getattr(node, '_fields', keys) != keys:
            raise ValueError(f'fields {node._fields}, expected {keys}')
        elif (node.keys() != key_set if is_mapping else
              tuple(sorted(node)) != keys):
          raise ValueError(f'keys {sorted(node)}, expected {keys}')
    except (ValueError, TypeError, KeyError, IndexError,
            AttributeError) as e:
      raise self._structure_error(trajectory, e) from None
    arrays = [_as_array(value) for value in tree.flatten(trajectory)]
    outer = () if self._num_envs is None else (self._num_envs,)
    for leaf, dtype, shape, array in zip(self._leaves, self._dtypes,
                                         self._shapes, arrays):
      want = outer + shape
      if array.dtype == dtype and array.shape == want:
        continue
      hint = ''
      if self._num_envs is None and array.ndim and array.shape[1:] == shape:
        hint = (f' It looks batched (outer dimension {array.shape[0]}); '
                f'make the observer with num_envs={array.shape[0]}.')
      elif self._num_envs is not None and array.shape == shape:
        hint = (f' It looks unbatched; this observer takes batches of '
                f'num_envs={self._num_envs} steps.')
      raise errors.TrajectorySpecError(
          f'trajectory field {leaf.path!r}: expected dtype {leaf.dtype} '
          f'shape {want}, received dtype {array.dtype} shape '
          f'{tuple(array.shape)}. Nothing from this step was written; the '
          f'data already in the buffer is unchanged.{hint}')
    problems = None
    for index, mode, low, high, check in self._checks:
      array = arrays[index]
      if mode == SCALAR:
        if low <= array.item() <= high:
          continue
      elif mode == SMALL_FLOAT:
        # min() and max() skip a NaN unless it comes first; sum() does not.
        values = array.ravel().tolist()
        if (low <= min(values) and max(values) <= high and
            not math.isnan(sum(values))):
          continue
      elif mode == SMALL:
        values = array.ravel().tolist()
        if low <= min(values) and max(values) <= high:
          continue
      elif mode == UNIFORM:
        # NaN propagates through minimum/maximum, and fails the comparison.
        if (low <= _MINIMUM(array, axis=None) and
            _MAXIMUM(array, axis=None) <= high):
          continue
      elif mode == ELEMENTWISE:
        if (low <= array).all() and (array <= high).all():
          continue
      elif np.isin(array, STEP_TYPES).all():
        continue
      problems = (problems or []) + self._values.problems(check, array)
    if problems:
      refused = [text + _ERROR_HINTS[setting]
                 for policy, setting, _, text in problems if policy == 'error']
      if refused:
        written = ('Nothing from this step was written' if self._num_envs is
                   None else "No environment's step of this call was written")
        raise errors.TrajectorySpecError(
            '; '.join(refused) + f'. {written}; the data already in the '
            'buffer is unchanged.')
      self._values.warn([problem[1:] for problem in problems
                         if problem[0] == 'warn'])
      self._checks = self._values.checks
    return arrays

  def _sequences_for_arrays(self, trajectory: Any, missing: set,
                            unexpected: set) -> List[str]:
    """Names the fields that hold a Python list or tuple where the spec has
    one array (tree flattens the list into one field per element)."""
    found = []
    for leaf in self._leaves:
      parts = [p for p in unexpected if p.startswith(leaf.path + '/')]
      if leaf.path not in missing or not parts:
        continue
      node = trajectory
      for key in leaf.path.split('/'):
        node = (node[key] if isinstance(node, collections.abc.Mapping)
                else getattr(node, key, None))
      if isinstance(node, (list, tuple)):
        found.append(
            f'field {leaf.path!r} is a Python {type(node).__name__} of '
            f'{len(node)} values; the spec expects one {leaf.dtype} array of '
            f'shape {tuple(leaf.shape)}: pass np.asarray(value, '
            f'dtype=np.{leaf.dtype})')
    return found

  def _structure_error(self, trajectory: Any,
                       error: Exception) -> errors.TrajectorySpecError:
    """Explains why `trajectory` does not have the data spec's structure."""
    expected = {leaf.path for leaf in self._leaves}
    received = {specs.join_path(p)
                for p, _ in tree.flatten_with_path(trajectory)}
    missing, unexpected = expected - received, received - expected
    if isinstance(trajectory, collections.abc.Mapping):
      text = (f'trajectory is a {type(trajectory).__name__} with keys '
              f'{sorted(map(str, trajectory))}, expected a tf_agents '
              'Trajectory (a namedtuple with fields '
              f'{list(self._data_spec._fields)}); pass Trajectory(**step) '
              '(tf_agents.trajectories.Trajectory) instead')
      differences = []
    else:
      text = 'trajectory structure does not match the data spec'
      differences = structure.container_differences(self._data_spec, trajectory)
    sequences = self._sequences_for_arrays(trajectory, missing, unexpected)
    if sequences:
      differences += sequences
    elif missing or unexpected:
      differences.append(f'missing fields {sorted(missing)}, unexpected '
                         f'fields {sorted(unexpected)}')
    elif differences or text.startswith('trajectory is'):
      differences.append(
          'the field paths are the same, only the container types differ (a '
          'namedtuple flattens in field order, a dict by sorted key: values '
          'would be stored under other fields)')
    else:
      differences.append(f'({error})')
    return errors.TrajectorySpecError(
        f"{text}{'; ' if text.startswith('trajectory is') else ': '}"
        f"{'; '.join(differences)}. Nothing from this step was written; the "
        'data already in the buffer is unchanged.')
