"""The value checks of a step's fields, precomputed per field.

`StepValidator` runs on every step, so what it checks in a field's values is
turned once into the cheapest test that covers it (`ValueChecks.checks`):
step types must be FIRST, MID or LAST; integer fields must lie within their
bounded spec's bounds; floating fields must be finite (`non_finite`) and
within their bounds (`float_bounds`), as configured. Only a field that fails
its test is examined further (`ValueChecks.problems`), to name the offending
values.
"""

from typing import List, NamedTuple, Optional, Set

from absl import logging
import numpy as np
from tf_agents.trajectories import time_step as ts

from smart_replay.spec import specs


# The step types the observer cuts episodes by; any other value is refused.
STEP_TYPES = (int(ts.StepType.FIRST), int(ts.StepType.MID),
              int(ts.StepType.LAST))
# What `non_finite` and `float_bounds` may be.
VALUE_POLICIES = ('error', 'warn', 'allow')
# How `StepValidator` tests a field's values on the hot path (see
# `ValueChecks`): one scalar; the min and max of a small array as a list
# (numpy's per-call cost is 10x Python's below ~32 values), with a NaN check
# for floats; the min and max of a larger array with numpy; an array against
# elementwise bounds; membership in `STEP_TYPES`.
SCALAR, SMALL_FLOAT, SMALL, UNIFORM, ELEMENTWISE, MEMBERS = range(6)
_SMALL_SIZE = 32
# Offending values named per field in an error or warning.
_MAX_REPORTED = 5


class ValueCheck(NamedTuple):
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


class ValueChecks:
  """The value checks of every field of a data spec.

  Attributes:
    checks: `(index, mode, low, high, check)` per field with something to
      check (see `_precompute`); recomputed when a field was warned about.

  Args:
    leaves: `specs.flatten_spec(data_spec)`.
    num_envs: None for unbatched steps; else the environments per step
      (outer dimension).
    non_finite: 'error', 'warn' or 'allow' (see `StepValidator`).
    float_bounds: 'error', 'warn' or 'allow' (see `StepValidator`).
    step_types: the indices of the step type fields.
  """

  def __init__(self, leaves: List[specs.SpecLeaf], *,
               num_envs: Optional[int], non_finite: str, float_bounds: str,
               step_types: Set[int]):
    self._leaves = leaves
    self._dtypes = [np.dtype(leaf.dtype) for leaf in leaves]
    self._shapes = [tuple(leaf.shape) for leaf in leaves]
    self._num_envs = num_envs
    self._non_finite = non_finite
    self._float_bounds = float_bounds
    self._step_types = step_types
    # (field path, 'non_finite' | 'float_bounds') warned about already: not
    # checked any more (see `_precompute`).
    self._warned = set()
    self.checks = self._precompute()

  def warn(self, problems: list) -> None:
    """Logs each `(setting, path, text)` of a written step, once per field.

    A field is not checked for that setting any more afterwards (`checks` is
    recomputed), so a field that is always out of its (loose) bounds costs
    no time.

    Args:
      problems: `(setting, path, text)` per problem the step was written
        with ('warn').
    """
    for setting, path, text in problems:
      if (path, setting) in self._warned:
        continue
      self._warned.add((path, setting))
      logging.warning("%s. The step was written (%s='warn'); this is logged "
                      'once per field.', text, setting)
    if problems:
      self.checks = self._precompute()

  def _precompute(self) -> list:
    """Precomputes the value checks of every field, for `checks`.

    Step types must be FIRST, MID or LAST; integer fields of a bounded spec
    must lie within the bounds (unless those span the whole dtype); floating
    fields must be finite unless `non_finite` is 'allow', and within bounded
    spec's bounds unless `float_bounds` is 'allow'. A field and policy that
    were warned about once are not checked any more.

    Returns:
      `(index, mode, low, high, check)` per field with something to check:
      the fast test is `low <= value <= high` for one scalar (`SCALAR`),
      `low <= min(array)` and `max(array) <= high` (`SMALL`, `SMALL_FLOAT`
      in Python, `UNIFORM` in numpy), the same elementwise
      (`ELEMENTWISE`), or step type membership (`MEMBERS`); a NaN fails
      each of them. `check` (a `ValueCheck`) describes a failure.
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
        check = ValueCheck(leaf.path, 'step_type', None, None, False, '')
      elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if not bounded or (low.min() <= info.min and high.max() >= info.max):
          continue
        fast_low, fast_high = low, high
        check = ValueCheck(leaf.path, 'integer', low, high, False,
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
        check = ValueCheck(
            leaf.path, 'float', low if bounded else None,
            high if bounded else None, finite,
            self._bounds_text(leaf, low, high) if bounded else '')
      else:
        continue  # bool, string, complex: dtype and shape only.
      if fast_low is None:
        mode = MEMBERS
      elif scalar and not shape:
        mode, fast_low, fast_high = SCALAR, fast_low.item(), fast_high.item()
      elif fast_low.min() == fast_low.max() and (
          fast_high.min() == fast_high.max()):
        fast_low, fast_high = fast_low.flat[0], fast_high.flat[0]
        mode = UNIFORM
        if np.prod(shape, dtype=np.int64) * (self._num_envs or 1) <= (
            _SMALL_SIZE):
          mode = SMALL_FLOAT if check.kind == 'float' else SMALL
          fast_low, fast_high = fast_low.item(), fast_high.item()
      else:
        mode = ELEMENTWISE
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

  def problems(self, check: ValueCheck, array: np.ndarray) -> list:
    """Why the values of a field failed their fast test.

    Args:
      check: the field's `ValueCheck` (from `checks`).
      array: the field's values.

    Returns:
      `(policy, setting, path, text)` per problem: policy 'error', 'warn' or
      'allow', from `setting` ('non_finite', 'float_bounds'; None for the
      problems that are always errors). Empty if the values are acceptable
      (e.g. NaN/Inf that `non_finite` allows).
    """
    path = check.path
    if check.kind == 'step_type':
      bad = ~np.isin(array, STEP_TYPES)
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
