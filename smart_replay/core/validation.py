"""Checks every step an observer writes against the data spec.

The stock TF-Agents observers switch Reverb's write validation off: a step of
the wrong dtype or shape is stored and poisons the tables until sampling fails,
far from the step that caused it. `StepValidator` checks each step before
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
cheapest test that covers them (see `_value_checks`); only a step that fails
its test is examined further, to name the offending values.
"""

import collections.abc
import math
from typing import Any, List, NamedTuple, Optional

from absl import logging
import numpy as np
from tf_agents.trajectories import time_step as ts
import tree

from smart_replay import errors
from smart_replay.core import specs


# The step types the observer cuts episodes by; any other value is refused.
_STEP_TYPES = (int(ts.StepType.FIRST), int(ts.StepType.MID),
               int(ts.StepType.LAST))
# What `non_finite` and `float_bounds` may be.
VALUE_POLICIES = ('error', 'warn', 'allow')
# How `StepValidator` tests a field's values on the hot path (see
# `_value_checks`): one scalar; the min and max of a small array as a list
# (numpy's per-call cost is 10x Python's below ~32 values), with a NaN check
# for floats; the min and max of a larger array with numpy; an array against
# elementwise bounds; membership in `_STEP_TYPES`.
_SCALAR, _SMALL_FLOAT, _SMALL, _UNIFORM, _ELEMENTWISE, _MEMBERS = range(6)
_SMALL_SIZE = 32
# Offending values named per field in an error or warning.
_MAX_REPORTED = 5
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


def check_num_envs(num_envs: Optional[int]) -> None:
  """Checks an observer's `num_envs`.

  Args:
    num_envs: None (unbatched steps) or the environments per step.

  Raises:
    ValueError: unless it is None or an integer >= 1.
  """
  if num_envs is not None and (isinstance(num_envs, bool) or
                               not isinstance(num_envs, int) or num_envs < 1):
    raise ValueError(f'num_envs must be None (unbatched) or an integer >= 1, '
                     f'got {num_envs!r}.')


class _ValueCheck(NamedTuple):
  """What is checked in the values of one field, to describe a failure.

  Attributes:
    path: the field's path.
    kind: 'step_type' (must be FIRST, MID or LAST), 'integer' (within its
      bounds) or 'float' (finite and/or within its bounds).
    low, high: the spec's bounds broadcast to the field's shape (None for
      step types and fields whose bounds are not checked).
    finite: whether NaN/Inf are looked for (`non_finite` is not 'allow').
    bounds: the bounds as text, e.g. 'float32[3] in [-10.0, 40.0]'.
  """
  path: str
  kind: str
  low: Optional[np.ndarray]
  high: Optional[np.ndarray]
  finite: bool
  bounds: str


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
    check_num_envs(num_envs)
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
    self._non_finite = non_finite
    self._float_bounds = float_bounds
    # (field path, 'non_finite' | 'float_bounds') warned about already: not
    # checked any more (see `_value_checks`).
    self._warned = set()
    paths = [leaf.path for leaf in self._leaves]
    self._step_types = {paths.index('step_type'),
                        paths.index('next_step_type')}
    self._checks = self._value_checks()
    # Where a step must hold the spec's keys in its flattening order (tree's
    # own check ignores keys): (steps, keys, key set, is a mapping).
    self._keyed = [(steps, keys, frozenset(keys), is_mapping)
                   for steps, keys, is_mapping in specs.keyed_nodes(data_spec)]

  def __call__(self, trajectory: Any) -> List[np.ndarray]:
    """Returns the step's fields, flat, if they match the data spec.

    Checks the structure, then each field's dtype and shape, then its values
    (`_value_checks`); logs the warnings of an accepted step.

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
      if mode == _SCALAR:
        if low <= array.item() <= high:
          continue
      elif mode == _SMALL_FLOAT:
        # min() and max() skip a NaN unless it comes first; sum() does not.
        values = array.ravel().tolist()
        if (low <= min(values) and max(values) <= high and
            not math.isnan(sum(values))):
          continue
      elif mode == _SMALL:
        values = array.ravel().tolist()
        if low <= min(values) and max(values) <= high:
          continue
      elif mode == _UNIFORM:
        # NaN propagates through minimum/maximum, and fails the comparison.
        if (low <= _MINIMUM(array, axis=None) and
            _MAXIMUM(array, axis=None) <= high):
          continue
      elif mode == _ELEMENTWISE:
        if (low <= array).all() and (array <= high).all():
          continue
      elif np.isin(array, _STEP_TYPES).all():
        continue
      problems = (problems or []) + self._value_problems(check, array)
    if problems:
      refused = [text + _ERROR_HINTS[setting]
                 for policy, setting, _, text in problems if policy == 'error']
      if refused:
        written = ('Nothing from this step was written' if self._num_envs is
                   None else "No environment's step of this call was written")
        raise errors.TrajectorySpecError(
            '; '.join(refused) + f'. {written}; the data already in the '
            'buffer is unchanged.')
      self._warn([problem[1:] for problem in problems
                  if problem[0] == 'warn'])
    return arrays

  def _warn(self, problems: list) -> None:
    """Logs each `(setting, path, text)` of a written step, once per field.

    A field is not checked for that setting any more afterwards, so a field
    that is always out of its (loose) bounds costs no time.
    """
    for setting, path, text in problems:
      if (path, setting) in self._warned:
        continue
      self._warned.add((path, setting))
      logging.warning("%s. The step was written (%s='warn'); this is logged "
                      'once per field.', text, setting)
    if problems:
      self._checks = self._value_checks()

  def _value_checks(self) -> list:
    """Precomputes the value checks of every field, for `__call__`.

    Step types must be FIRST, MID or LAST; integer fields of a bounded spec
    must lie within the bounds (unless those span the whole dtype); floating
    fields must be finite unless `non_finite` is 'allow', and within bounded
    spec's bounds unless `float_bounds` is 'allow'. A field and policy that
    were warned about once are not checked any more.

    Returns:
      `(index, mode, low, high, check)` per field with something to check:
      the fast test is `low <= value <= high` for one scalar (`_SCALAR`),
      `low <= min(array)` and `max(array) <= high` (`_SMALL`, `_SMALL_FLOAT`
      in Python, `_UNIFORM` in numpy), the same elementwise
      (`_ELEMENTWISE`), or step type membership (`_MEMBERS`); a NaN fails
      each of them. `check` (a `_ValueCheck`) describes a failure.
    """
    checks = []
    scalar = self._num_envs is None
    for index, (leaf, dtype, shape) in enumerate(zip(
        self._leaves, self._dtypes, self._shapes)):
      if not np.prod(shape, dtype=np.int64):
        continue  # No values.
      bounded = leaf.minimum is not None
      low = high = None
      if bounded:
        low = np.broadcast_to(np.asarray(leaf.minimum, dtype), shape)
        high = np.broadcast_to(np.asarray(leaf.maximum, dtype), shape)
      if index in self._step_types:
        if np.issubdtype(dtype, np.integer):
          fast_low, fast_high = np.asarray(0, dtype), np.asarray(2, dtype)
        else:
          fast_low = fast_high = None  # Membership: 1.5 is no step type.
        check = _ValueCheck(leaf.path, 'step_type', None, None, False, '')
      elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if not bounded or (low.min() <= info.min and high.max() >= info.max):
          continue
        fast_low, fast_high = low, high
        check = _ValueCheck(leaf.path, 'integer', low, high, False,
                            self._bounds_text(leaf, low, high))
      elif np.issubdtype(dtype, np.floating):
        finite = self._non_finite != 'allow' and (
            leaf.path, 'non_finite') not in self._warned
        bounded = bounded and self._float_bounds != 'allow' and (
            leaf.path, 'float_bounds') not in self._warned
        if not finite and not bounded:
          continue
        largest = np.finfo(dtype).max if finite else np.inf
        fast_low = np.full(shape, -largest, dtype)
        fast_high = np.full(shape, largest, dtype)
        if bounded:
          fast_low = np.maximum(fast_low, low)
          fast_high = np.minimum(fast_high, high)
        check = _ValueCheck(
            leaf.path, 'float', low if bounded else None,
            high if bounded else None, finite,
            self._bounds_text(leaf, low, high) if bounded else '')
      else:
        continue  # bool, string, complex: dtype and shape only.
      if fast_low is None:
        mode = _MEMBERS
      elif scalar and not shape:
        mode, fast_low, fast_high = _SCALAR, fast_low.item(), fast_high.item()
      elif fast_low.min() == fast_low.max() and (
          fast_high.min() == fast_high.max()):
        fast_low, fast_high = fast_low.flat[0], fast_high.flat[0]
        mode = _UNIFORM
        if np.prod(shape, dtype=np.int64) * (self._num_envs or 1) <= (
            _SMALL_SIZE):
          mode = _SMALL_FLOAT if check.kind == 'float' else _SMALL
          fast_low, fast_high = fast_low.item(), fast_high.item()
      else:
        mode = _ELEMENTWISE
        fast_low, fast_high = np.array(fast_low), np.array(fast_high)
      checks.append((index, mode, fast_low, fast_high, check))
    return checks

  @staticmethod
  def _bounds_text(leaf: specs.SpecLeaf, low: np.ndarray,
                   high: np.ndarray) -> str:
    """E.g. 'int64[2] in [0, 3]', or elementwise 'minimum [..], maximum [..]'."""
    if low.min() == low.max() and high.min() == high.max():
      bounds = f'[{low.flat[0]}, {high.flat[0]}]'
    else:
      bounds = f'[minimum {low.tolist()}, maximum {high.tolist()}]'
    return f'{leaf.dtype}{list(leaf.shape)} in {bounds}'

  def _offenders(self, array: np.ndarray, bad: np.ndarray) -> str:
    """The values of `array` where `bad` holds, with their index."""
    if array.ndim == 0:
      return str(array[()])
    where = np.argwhere(bad)
    shown = []
    for index in where[:_MAX_REPORTED]:
      text = f'{array[tuple(index)]} at index {index.tolist()}'
      if self._num_envs is not None:
        text += f' (environment {index[0]})'
      shown.append(text)
    if len(where) > _MAX_REPORTED:
      shown.append(f'and {len(where) - _MAX_REPORTED} more')
    return ', '.join(shown)

  def _value_problems(self, check: _ValueCheck, array: np.ndarray) -> list:
    """Why the values of a field failed their fast test.

    Returns:
      `(policy, setting, path, text)` per problem: policy 'error', 'warn' or
      'allow', from `setting` ('non_finite', 'float_bounds'; None for the
      problems that are always errors). Empty if the values are acceptable
      (e.g. NaN/Inf that `non_finite` allows).
    """
    path = check.path
    if check.kind == 'step_type':
      bad = ~np.isin(array, _STEP_TYPES)
      return [('error', None, path, f'trajectory field {path!r} holds '
               f'{self._offenders(array, bad)}; expected a TF-Agents StepType: '
               'FIRST=0, MID=1 or LAST=2 (the observer cuts episodes by it)')]
    if check.kind == 'integer':
      bad = (array < check.low) | (array > check.high)
      return [('error', None, path, f'trajectory field {path!r} holds '
               f'{self._offenders(array, bad)}, outside the bounds of its '
               f'spec: expected {check.bounds}')]
    problems = []
    finite = np.isfinite(array)
    if check.finite and not finite.all():
      problems.append((self._non_finite, 'non_finite', path,
                       f'trajectory field {path!r} holds '
                       f'{self._offenders(array, ~finite)}; expected finite '
                       'values'))
    if check.low is not None:
      bad = finite & ((array < check.low) | (array > check.high))
      if bad.any():
        problems.append((self._float_bounds, 'float_bounds', path,
                         f'trajectory field {path!r} holds '
                         f'{self._offenders(array, bad)}, outside the bounds '
                         f'of its spec: expected {check.bounds}'))
    return problems

  def _structure_error(self, trajectory: Any,
                       error: Exception) -> errors.TrajectorySpecError:
    """Explains why `trajectory` does not have the data spec's structure."""
    expected = {leaf.path for leaf in self._leaves}
    received = {'/'.join(map(str, p)) or '<root>'
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
      differences = specs.container_differences(self._data_spec, trajectory)
    if missing or unexpected:
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
