"""Argument checks shared by the manager and its parts."""

from typing import Any


def positive(name: str, value: Any, *, integer: bool = False) -> None:
  """Raises unless `value` is a positive number (or integer); bools are refused.

  Args:
    name: the argument's name, for the message.
    value: the value to check.
    integer: require an `int` instead of any int or float.

  Raises:
    ValueError: naming the argument, what was expected and the value.
  """
  kind = int if integer else (int, float)
  if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
    expected = 'a positive integer' if integer else 'a positive number'
    raise ValueError(f'{name} must be {expected}, got {value!r}.')
