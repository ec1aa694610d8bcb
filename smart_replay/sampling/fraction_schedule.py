"""How much of each batch comes from the starter: fixed, or annealed by step.

A `FractionSchedule` gives the starter's share of a batch at a train step,
like the importance-sampling beta of a prioritized table: fixed
(`final=None`), or annealed from `initial` to `final` over `steps` train steps
and then held at `final`:

- 'linear': `initial + (final - initial) * min(1, step / steps)`;
- 'exponential': `initial * (final / initial) ** min(1, step / steps)`, a
  geometric interpolation (the fraction falls by the same factor every train
  step, e.g. 0.5 to 0.1 over 50k steps halves about every 21.5k steps); both
  ends must be > 0.

The schedule is read from the train-step variable when a batch is made, so a
resumed run (whose train step is restored from its agent checkpoint) continues
the schedule where it was.
"""

import dataclasses
from typing import Optional, Union

import gin
import tensorflow as tf

KINDS = ('linear', 'exponential')


@gin.configurable
@dataclasses.dataclass(frozen=True)
class FractionSchedule:
  """The starter's share of each batch, as a function of the train step.

  Attributes:
    initial: the share at train step 0, in [0, 1].
    final: the share after `steps` train steps, in [0, 1]; None keeps
      `initial` throughout.
    steps: train steps over which the share moves from `initial` to `final`
      (> 0; required with `final`).
    kind: 'linear' or 'exponential' (see the module docstring).

  Raises:
    ValueError: if a field is invalid; names it, its value and what was
      expected.
  """
  initial: float
  final: Optional[float] = None
  steps: Optional[int] = None
  kind: str = 'linear'

  def __post_init__(self):
    for name in ('initial', 'final'):
      value = getattr(self, name)
      if value is None and name == 'final':
        continue
      if (isinstance(value, bool) or not isinstance(value, (int, float)) or
          not 0.0 <= value <= 1.0):
        raise ValueError(f'FractionSchedule.{name} must be a number in '
                         f'[0, 1] (the starter\'s share of a batch), got '
                         f'{value!r}.')
    if self.kind not in KINDS:
      raise ValueError(f'FractionSchedule.kind must be one of {KINDS}, got '
                       f'{self.kind!r}.')
    if self.final is None:
      if self.steps is not None:
        raise ValueError(f'FractionSchedule.steps={self.steps!r} needs a '
                         'final fraction to anneal to; pass final=... or '
                         'steps=None for a fixed fraction.')
      return
    if (isinstance(self.steps, bool) or not isinstance(self.steps, int) or
        self.steps < 1):
      raise ValueError(f'FractionSchedule.steps must be a positive integer '
                       f'(train steps from initial={self.initial} to '
                       f'final={self.final}), got {self.steps!r}.')
    if self.kind == 'exponential' and min(self.initial, self.final) <= 0:
      raise ValueError(
          "FractionSchedule(kind='exponential') interpolates geometrically, "
          f'so initial and final must be > 0; got initial={self.initial}, '
          f"final={self.final}. Use kind='linear' to reach 0.")

  @property
  def annealed(self) -> bool:
    """True if the fraction changes with the train step."""
    return self.final is not None and self.final != self.initial

  def value(self, step: int) -> float:
    """The starter's share at train step `step` (a Python float).

    Args:
      step: a train step, >= 0.

    Returns:
      The fraction in [0, 1].
    """
    if not self.annealed:
      return float(self.initial)
    progress = min(1.0, max(0, int(step)) / self.steps)
    if self.kind == 'linear':
      return self.initial + (self.final - self.initial) * progress
    return self.initial * (self.final / self.initial) ** progress

  def tensor(self, train_step: Optional[tf.Variable]) -> tf.Tensor:
    """The share at the current value of `train_step`, as a float64 tensor.

    Args:
      train_step: the train-step variable; may be None for a fixed fraction.

    Returns:
      A scalar float64 tensor (evaluated each time a batch is made).

    Raises:
      ValueError: if the schedule is annealed and `train_step` is not a
        variable.
    """
    if not self.annealed:
      return tf.constant(float(self.initial), tf.float64)
    if not isinstance(train_step, tf.Variable):
      raise ValueError(
          f'the starter fraction is annealed ({self.describe()}); pass the '
          'train step variable as get_dataset(train_step=...), got '
          f'{train_step!r}.')
    progress = tf.minimum(tf.constant(1.0, tf.float64),
                          tf.cast(tf.maximum(train_step, 0), tf.float64)
                          / self.steps)
    initial = tf.constant(float(self.initial), tf.float64)
    final = tf.constant(float(self.final), tf.float64)
    if self.kind == 'linear':
      return initial + (final - initial) * progress
    return initial * tf.pow(final / initial, progress)

  def describe(self) -> str:
    """A one-line description, e.g. 'linear 0.5 -> 0.1 over 50000 steps'."""
    if not self.annealed:
      return f'fixed {self.initial:g}'
    return (f'{self.kind} {self.initial:g} -> {self.final:g} over '
            f'{self.steps} train steps')


def as_schedule(fraction: Union[None, float, FractionSchedule]
                ) -> Optional[FractionSchedule]:
  """A `FractionSchedule` from a number (fixed), a schedule, or None.

  Args:
    fraction: None, a number in [0, 1], or a `FractionSchedule`.

  Returns:
    None for None, else a `FractionSchedule`.

  Raises:
    ValueError: if `fraction` is neither (names its value).
  """
  if fraction is None or isinstance(fraction, FractionSchedule):
    return fraction
  if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
    raise ValueError('starter_fraction must be a number in [0, 1] or a '
                     f'FractionSchedule, got {fraction!r}.')
  return FractionSchedule(initial=float(fraction))
