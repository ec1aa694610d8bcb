"""How the containers of a nest compare to a data spec's, key by key.

`tree.assert_same_structure(..., check_types=False)` compares nests position
by position only, so a step whose dict or namedtuple has other keys, or its
keys in another flattening order, can pass it and have its values stored
under other fields. `keyed_nodes` lists where a step must hold the spec's
keys; `container_differences` names where its containers differ.
"""

import collections.abc
from typing import Any, List, Optional, Tuple

import tree

from smart_replay.spec import specs


def _container_kind(node: Any) -> str:
  """Names the kind of a nest node: 'Trajectory (namedtuple)', 'dict', ..."""
  if not tree.is_nested(node):
    return f'a leaf ({type(node).__name__})'
  if hasattr(node, '_fields'):
    return f'{type(node).__name__} (namedtuple)'
  if isinstance(node, collections.abc.Mapping):
    return f'{type(node).__name__} with keys {sorted(map(str, node))}'
  return f'{type(node).__name__} of {len(node)}'


def _key_order(node: Any) -> Optional[Tuple[Any, ...]]:
  """The keys of a mapping (sorted) or namedtuple (fields) in flattening
  order; None for other nodes."""
  if isinstance(node, collections.abc.Mapping):
    return tuple(sorted(node))
  return getattr(node, '_fields', None)


def keyed_nodes(spec: Any) -> List[Tuple[Tuple[Tuple[Any, int], ...],
                                         Tuple[Any, ...], bool]]:
  """The mappings and namedtuples of a nest, outermost first.

  `tree.assert_same_structure(..., check_types=False)` compares nests
  position by position only: a dict with another key, or a namedtuple whose
  fields are in another order than the spec's sorted keys, passes, and its
  values would be stored under other fields. A step's nodes at these paths
  must have the same keys in the same flattening order (a plain tuple or
  list stands for them by position, as in `tf.nest`).

  Args:
    spec: a nest.

  Returns:
    `(steps, keys, is_mapping)` per node: `steps` lead from the root to it,
    one `(key, index)` per level (the key or field name, None in a plain
    sequence; the position in flattening order); `keys` in flattening order
    (sorted for a mapping, the fields of a namedtuple).
  """
  found = []

  def walk(node, steps):
    if not tree.is_nested(node):
      return
    keys = _key_order(node)
    if keys is not None:
      found.append((steps, keys, isinstance(node, collections.abc.Mapping)))
    names = keys or [None] * len(node)
    if isinstance(node, collections.abc.Mapping):
      children = [node[key] for key in keys]
    else:
      children = list(node)
    for index, (name, child) in enumerate(zip(names, children)):
      walk(child, steps + ((name, index),))

  walk(spec, ())
  return found


def container_differences(expected: Any, received: Any,
                          limit: int = 3) -> List[str]:
  """Where a step's containers do not fit the spec's, whatever its leaves.

  Names where `received` has a leaf for a nest, a mapping for a plain
  sequence, or keys in another flattening order than the spec's (e.g. a
  dict for a `Trajectory`, a namedtuple for a dict): such steps may have
  the same field paths as the spec, yet would be refused or stored under
  other fields. A plain tuple or list stands for any node by position, as
  in `tf.nest`; a mapping with other keys is left to a comparison of field
  paths.

  Args:
    expected: the reference nest (e.g. the data spec).
    received: the nest to compare (e.g. a step).
    limit: report at most this many places.

  Returns:
    One sentence per place, outermost first, e.g. "at <root> the data spec
    has Trajectory (namedtuple), the trajectory dict with keys [...]".
  """
  found = []

  def walk(spec, value, path):
    if len(found) >= limit or not tree.is_nested(spec):
      return
    keys = _key_order(spec)
    spec_map = isinstance(spec, collections.abc.Mapping)
    value_map = isinstance(value, collections.abc.Mapping)
    if not tree.is_nested(value):
      differs = True
    elif value_map:
      differs = keys is None or (not spec_map and _key_order(value) != keys)
    else:
      differs = keys is not None and getattr(value, '_fields', keys) != keys
    if differs:
      found.append(f'at {specs.join_path(path)} the data spec has '
                   f'{_container_kind(spec)}, the trajectory '
                   f'{_container_kind(value)}')
      return
    children = [spec[key] for key in keys] if spec_map else list(spec)
    names = keys or range(len(children))
    if value_map:
      pairs = [(name, child, value[name])
               for name, child in zip(names, children) if name in value]
    else:
      pairs = zip(names, children, value)
    for name, a, b in pairs:
      walk(a, b, path + (name,))

  walk(expected, received, ())
  return found
