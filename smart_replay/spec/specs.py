"""Data specs: flattening, table signatures, serialization and comparison.

This is the first step of the data flow (spec -> table config -> server): it
turns a TF-Agents `collect_data_spec` into the `signature=` of a Reverb table
and into a JSON-friendly description that a checkpoint manifest can store and
compare field by field.
"""

import base64
import os
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tree
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory as trajectory_lib


class SpecLeaf(NamedTuple):
  """One tensor of a data spec, addressed by its path in the nest.

  Attributes:
    path: the leaf's path, joined with '/' (e.g. 'observation/temperature').
    dtype: numpy dtype name, e.g. 'float32'.
    shape: the shape as a tuple; `None` for an unknown dimension.
    minimum: lower bound for a bounded spec (a list), else None.
    maximum: upper bound for a bounded spec (a list), else None.
  """
  path: str
  dtype: str
  shape: Tuple[Optional[int], ...]
  minimum: Optional[list] = None
  maximum: Optional[list] = None

  def describe(self) -> str:
    """Returns a short human-readable form, e.g. 'float32[3] in [-1, 1]'."""
    text = f'{self.dtype}{list(self.shape)}'
    if self.minimum is not None:
      text += f' in [{_compact(self.minimum)}, {_compact(self.maximum)}]'
    return text


def _compact(values: list):
  """Shows a bound list as a scalar when every element is the same."""
  flat = np.asarray(values).ravel().tolist()
  return flat[0] if flat and all(v == flat[0] for v in flat) else values


def join_path(path: Sequence[Any]) -> str:
  """A nest path as text, e.g. 'observation/temperature'.

  Args:
    path: the keys, field names or indices from the root to a node.

  Returns:
    The path joined with '/'; '<root>' for the empty path.
  """
  return '/'.join(str(p) for p in path) or '<root>'


def validate_data_spec(data_spec: Any) -> None:
  """Checks that `data_spec` is a non-empty nest of `tf.TensorSpec`.

  Args:
    data_spec: the nest to check, e.g. `agent.collect_data_spec`.

  Raises:
    ValueError: if the nest is empty or a leaf is not a `tf.TensorSpec`; the
      message names the leaf's path and type.
  """
  leaves = tree.flatten_with_path(data_spec)
  if not leaves:
    raise ValueError(
        f'data_spec is empty ({data_spec!r}); expected a nest of tf.TensorSpec '
        'such as agent.collect_data_spec.')
  for path, leaf in leaves:
    if not isinstance(leaf, tf.TensorSpec):
      raise ValueError(
          f'data_spec field {join_path(path)!r} is a {type(leaf).__name__} '
          f'({leaf!r}); expected a tf.TensorSpec. Pass agent.collect_data_spec '
          'or convert array specs with tensor_spec.from_spec().')


def validate_trajectory_spec(data_spec: Any) -> None:
  """Checks that `data_spec` is a TF-Agents `Trajectory` of `tf.TensorSpec`.

  The observer needs the step types to find episode boundaries, so the spec
  must be a `Trajectory` such as `agent.collect_data_spec`.

  Args:
    data_spec: the spec to check.

  Raises:
    ValueError: if it is not a `Trajectory`, or a leaf is not a TensorSpec.
  """
  if not isinstance(data_spec, trajectory_lib.Trajectory):
    raise ValueError(
        f'data_spec must be a tf_agents Trajectory spec such as '
        f'agent.collect_data_spec or policy.collect_data_spec, got a '
        f'{type(data_spec).__name__}: {data_spec!r}')
  validate_data_spec(data_spec)


def flatten_spec(data_spec: Any) -> List[SpecLeaf]:
  """Flattens a spec nest into `SpecLeaf`s in `tree.flatten` order.

  Args:
    data_spec: a nest of `tf.TensorSpec` (bounded specs keep their bounds).

  Returns:
    One `SpecLeaf` per tensor, in the order `tree.flatten` yields them.
  """
  leaves = []
  for path, spec in tree.flatten_with_path(data_spec):
    minimum = maximum = None
    if isinstance(spec, tensor_spec.BoundedTensorSpec):
      minimum = np.asarray(spec.minimum).tolist()
      maximum = np.asarray(spec.maximum).tolist()
    leaves.append(SpecLeaf(
        path=join_path(path),
        dtype=spec.dtype.name,
        shape=tuple(spec.shape.as_list()) if spec.shape.rank is not None else (),
        minimum=minimum,
        maximum=maximum))
  return leaves


def table_signature(data_spec: Any, sequence_length: Optional[int]) -> Any:
  """Builds the Reverb table signature for items of `sequence_length` steps.

  Bounded specs become plain `tf.TensorSpec` (Reverb signatures carry dtype and
  shape only) and every leaf gets an outer time dimension.

  Args:
    data_spec: a nest of `tf.TensorSpec`, e.g. `agent.collect_data_spec`.
    sequence_length: number of steps per item, >= 1; None for items of any
      length (episode tables).

  Returns:
    The same nest of `tf.TensorSpec` with shape `[sequence_length, *shape]`.

  Raises:
    ValueError: if `sequence_length` < 1 or the spec is invalid.
  """
  if sequence_length is not None and (not isinstance(sequence_length, int) or
                                      sequence_length < 1):
    raise ValueError(f'sequence_length must be an integer >= 1 or None, got '
                     f'{sequence_length!r}.')
  validate_data_spec(data_spec)
  return tree.map_structure_with_path(
      lambda path, s: tf.TensorSpec([sequence_length] + s.shape.as_list(),
                                    s.dtype, name=join_path(path)),
      data_spec)


def describe_signature(signature: Any) -> Optional[List[str]]:
  """Describes a Reverb table signature leaf by leaf, for comparisons.

  Args:
    signature: a nest of `tf.TensorSpec`, or None (a table without one).

  Returns:
    `SpecLeaf.describe()` of every leaf, in flattening order; None for None.
  """
  if signature is None:
    return None
  return [leaf.describe() for leaf in flatten_spec(signature)]


def spec_to_json(data_spec: Any) -> dict:
  """Serializes a spec nest for a manifest.

  Args:
    data_spec: a nest of `tf.TensorSpec`.

  Returns:
    A dict with `leaves` (readable, one entry per tensor) and `proto` (the
    TF-Agents spec proto, base64) from which `spec_from_json` rebuilds the nest.
  """
  proto = tensor_spec.to_proto(data_spec).SerializeToString()
  return {
      'leaves': [leaf._asdict() for leaf in flatten_spec(data_spec)],
      'proto': base64.b64encode(proto).decode('ascii'),
  }


def spec_from_json(data: dict) -> Any:
  """Rebuilds the spec nest stored by `spec_to_json`.

  Args:
    data: the dict `spec_to_json` returned.

  Returns:
    The original nest of `tf.TensorSpec`/`BoundedTensorSpec`; a top-level
    `Trajectory` comes back as `tf_agents.trajectories.Trajectory`.

  Raises:
    ValueError: if `data` has no `proto` entry.
  """
  if 'proto' not in data:
    raise ValueError(f'stored spec has no "proto" entry; keys: {sorted(data)}')
  from tensorflow.core.protobuf import struct_pb2  # pylint: disable=g-import-not-at-top
  proto = struct_pb2.StructuredValue.FromString(base64.b64decode(data['proto']))
  return as_trajectory(tensor_spec.from_proto(proto))


def as_trajectory(spec: Any) -> Any:
  """Returns a look-alike `Trajectory` namedtuple as TF-Agents' own class.

  Specs decoded from protos (a manifest, a saved policy's policy_specs.pbtxt)
  come back as namedtuples that have `Trajectory`'s fields but another class;
  agents and observers check the type.

  Args:
    spec: any spec nest.

  Returns:
    `tf_agents.trajectories.Trajectory(*spec)` for a look-alike, else `spec`.
  """
  if (not isinstance(spec, trajectory_lib.Trajectory) and
      getattr(spec, '_fields', None) == trajectory_lib.Trajectory._fields):
    return trajectory_lib.Trajectory(*spec)
  return spec


def diff_specs(stored: Any, requested: Any, *, prefix: str = 'data_spec',
               bounds_for: Sequence[str] = ()) -> List[Tuple[str, str, str]]:
  """Compares two spec nests (array or tensor specs) by dtype and shape.

  Args:
    stored: one spec nest.
    requested: the other.
    prefix: name prepended to each field path in the result.
    bounds_for: leaf paths whose bounds must match too (e.g. 'action').

  Returns:
    `(field, stored_description, requested_description)` per differing leaf.
  """
  def leaves(spec):
    return [leaf._asdict() if leaf.path in bounds_for else
            dict(leaf._asdict(), minimum=None, maximum=None)
            for leaf in flatten_spec(tensor_spec.from_spec(spec))]
  return diff_spec_leaves(leaves(stored), leaves(requested), prefix=prefix)


def diff_spec_leaves(stored: List[dict], requested: List[dict],
                     prefix: str = 'data_spec') -> List[Tuple[str, str, str]]:
  """Compares two flattened specs field by field.

  Args:
    stored: `SpecLeaf._asdict()` entries of one spec.
    requested: the same for the other spec.
    prefix: name prepended to each field path in the result.

  Returns:
    `(field, stored_description, requested_description)` per differing
    tensor; a field missing on one side is described as '<missing>'.
  """
  def by_path(leaves):
    return {leaf['path']: SpecLeaf(**{**leaf, 'shape': tuple(leaf['shape'])})
            for leaf in leaves}
  old, new = by_path(stored), by_path(requested)
  diffs = []
  for path in list(old) + [p for p in new if p not in old]:
    a, b = old.get(path), new.get(path)
    a_text = a.describe() if a else '<missing>'
    b_text = b.describe() if b else '<missing>'
    if a_text != b_text:
      field = prefix if path == '<root>' else f'{prefix}/{path}'
      diffs.append((field, a_text, b_text))
  return diffs


def save_spec(path: str, data_spec: Any) -> None:
  """Writes a spec nest to a text file with TF-Agents' spec serialization.

  The file is what `tf_agents.specs.tensor_spec.to_pbtxt_file` writes (the
  format of a saved policy's `policy_specs.pbtxt`), so it can be read back by
  `load_spec` or by TF-Agents itself, e.g. on another machine.

  Args:
    path: the file to write (its folder is created).
    data_spec: a nest of `tf.TensorSpec`/`BoundedTensorSpec` (or array specs),
      e.g. `agent.collect_data_spec`.

  Raises:
    ValueError: if `data_spec` is not a valid spec nest.
  """
  data_spec = tensor_spec.from_spec(data_spec)
  validate_data_spec(data_spec)
  tensor_spec.to_pbtxt_file(os.fspath(path), data_spec)


def load_spec(path: str) -> Any:
  """Reads a spec nest written by `save_spec` (or `to_pbtxt_file`).

  Args:
    path: a `.pbtxt` spec file.

  Returns:
    The spec nest; a top-level trajectory comes back as TF-Agents'
    `Trajectory`.

  Raises:
    FileNotFoundError: if `path` does not exist.
    ValueError: if the file is not a TF-Agents spec file; names the path.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'spec file {path!r} does not exist; write it with '
                            'smart_replay.spec.specs.save_spec(path, '
                            'agent.collect_data_spec).')
  try:
    spec = tensor_spec.from_pbtxt_file(path)
  except Exception as e:  # text_format.ParseError and decoder errors.
    raise ValueError(f'spec file {path!r} is not a TF-Agents spec file '
                     f'(tensor_spec.to_pbtxt_file): {e}') from e
  return as_trajectory(spec)
