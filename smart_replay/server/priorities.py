"""Priority state of a server's prioritized tables, and priority updates.

`Priorities` holds, per prioritized table, the largest priority given so far
(a `tf.Variable`, so a Learner's `tf.function` can raise it); new items get
it unless their table sets `initial_priority` (the observers ask
`new_item_priority`). `update` checks and applies a batch of new priorities,
eagerly or traced, on one server; `update_sharded` on the shards that hold
each key.
"""

from typing import Any, Dict, Mapping, Sequence

import numpy as np
import reverb
import tensorflow as tf

from smart_replay.config import tables as tables_lib


class Priorities:
  """The largest priority so far of each prioritized table.

  Args:
    tables: the buffer's resolved table configs.
  """

  def __init__(self, tables: Sequence[tables_lib.TableConfig]):
    self._max = {c.name: tf.Variable(1.0, dtype=tf.float64, trainable=False,
                                     name=f'max_priority_{i}')
                 for i, c in enumerate(tables) if c.prioritized}

  def new_item_priority(self, table_name: str) -> float:
    """The priority new items of `table_name` get when it sets none.

    Args:
      table_name: a table's name.

    Returns:
      The table's largest priority so far (1.0 at first, and for tables
      that are not prioritized).
    """
    variable = self._max.get(table_name)
    return 1.0 if variable is None else float(variable.numpy())

  def current(self) -> Dict[str, float]:
    """`{prioritized table: largest priority so far}`."""
    return {name: float(v.numpy()) for name, v in self._max.items()}

  def restore(self, tables: Mapping[str, Mapping[str, Any]]) -> None:
    """Takes the largest priorities a checkpoint's manifest counted.

    Args:
      tables: the manifest's `counts['tables']`.
    """
    for name, variable in self._max.items():
      variable.assign(tables[name].get('max_priority', 1.0))

  def reset(self) -> None:
    """Back to 1.0 (after the tables were emptied)."""
    for variable in self._max.values():
      variable.assign(1.0)

  def update(self, tf_client: reverb.TFClient,
             config: tables_lib.TableConfig, keys: Any, priorities: Any, *,
             serving: tf.Variable, where: str) -> None:
    """Sets the priorities of sampled items; see
    `ReplayBufferManager.update_priorities`.

    Args:
      tf_client: a `reverb.TFClient` of the server.
      config: the prioritized table's config.
      keys: uint64 keys `[batch]`, or `[batch, steps]` (first column used).
      priorities: `[batch]` new priorities, e.g. TD errors.
      serving: False once the buffer is closed (a traced update then fails
        instead of waiting on the stopped server).
      where: the buffer, for messages.

    Raises:
      ValueError: if the shapes differ or (eagerly) a priority is not
        finite; traced, these checks raise `InvalidArgumentError`.
    """
    if not tf.is_tensor(keys):  # Python ints above 2**63 need uint64 first.
      keys = np.asarray(keys, np.uint64)
    keys = tf.convert_to_tensor(keys)
    if keys.shape.rank == 2:
      keys = keys[:, 0]
    keys = tf.cast(keys, tf.uint64)
    priorities = tf.cast(tf.convert_to_tensor(priorities), tf.float64)
    if keys.shape.rank != 1 or priorities.shape.rank != 1:
      raise ValueError(
          f'update_priorities: keys must have shape [batch] or [batch, steps] '
          f'and priorities [batch]; got keys {keys.shape}, priorities '
          f'{priorities.shape} (table {config.name!r}).')
    if tf.executing_eagerly():
      _check_eagerly(keys, priorities, config.name)
    checks = [
        tf.debugging.Assert(serving, [
            f'update_priorities: the buffer {where} is closed '
            f'(table {config.name!r})']),
        tf.debugging.assert_equal(
            tf.size(keys), tf.size(priorities),
            message=f'update_priorities: keys and priorities differ in length '
            f'(table {config.name!r})'),
        tf.debugging.assert_all_finite(
            priorities, f'update_priorities: a priority is not finite (table '
            f'{config.name!r})')]
    with tf.control_dependencies(checks):
      priorities = tf.abs(priorities) + config.priority_epsilon
    largest = self._max[config.name]
    largest.assign(tf.maximum(largest, tf.reduce_max(
        tf.concat([priorities, tf.zeros([1], tf.float64)], 0))))
    tf_client.update_priorities(config.name, keys, priorities)

  def update_sharded(self, tf_clients: Sequence[reverb.TFClient],
                     config: tables_lib.TableConfig, keys: Any,
                     priorities: Any, shards: Any, *, serving: tf.Variable,
                     where: Sequence[str], up: tf.Variable) -> None:
    """Sets sampled items' priorities on the shards that hold them.

    A shard gets an update only for keys it holds, and only while it
    answers: Reverb's update waits for its server without a timeout, so the
    keys of a shard that is down are dropped (its items keep their
    priorities, as if not sampled).

    Args:
      tf_clients: one `reverb.TFClient` per shard.
      config: the prioritized table's `TableConfig`.
      keys: uint64 item keys `[batch]` (or `[batch, num_steps]`).
      priorities: `[batch]` new priorities.
      shards: int32 `[batch]` (or `[batch, num_steps]`) shard of each key, as
        `ReplayInfo.shard` gives it.
      serving: False once the buffer stopped (a traced update then fails).
      where: each shard's address, for messages.
      up: bool `[shards]`, whether each shard answers (the manager's
        watcher keeps it).

    Raises:
      ValueError: if a shard index is not one of the shards (eagerly; in a
        graph, an `InvalidArgumentError` when run).
    """
    if not tf.is_tensor(keys):  # Python ints above 2**63 need uint64 first.
      keys = np.asarray(keys, np.uint64)
    shards, keys = tf.convert_to_tensor(shards), tf.convert_to_tensor(keys)
    priorities = tf.convert_to_tensor(priorities)
    if shards.shape.rank == 2:
      shards = shards[:, 0]
    if keys.shape.rank == 2:
      keys = keys[:, 0]
    n = len(tf_clients)
    if tf.executing_eagerly():
      bad = np.flatnonzero((shards.numpy() < 0) | (shards.numpy() >= n))
      if bad.size:
        raise ValueError(
            f'update_priorities: shards[{bad[0]}] = {shards.numpy()[bad[0]]}'
            f' is not a shard of this buffer (0..{n - 1}; table '
            f'{config.name!r}); pass ReplayInfo.shard.')
    in_range = tf.debugging.Assert(
        tf.reduce_all((shards >= 0) & (shards < n)),
        [f'update_priorities: a shard index is outside 0..{n - 1} (table '
         f'{config.name!r}); pass ReplayInfo.shard.'])
    with tf.control_dependencies([in_range]):
      shards = tf.identity(shards)
    for index, client in enumerate(tf_clients):
      mine = tf.equal(shards, index)
      def one(client=client, mine=mine, index=index):
        self.update(client, config, tf.boolean_mask(keys, mine),
                    tf.boolean_mask(priorities, mine), serving=serving,
                    where=where[index])
        return tf.constant(0)
      tf.cond(tf.reduce_any(mine) & up[index], one, lambda: tf.constant(0))


def _check_eagerly(keys: tf.Tensor, priorities: tf.Tensor, table: str) -> None:
  """The shape and finiteness checks of an eager update, with the values."""
  values = priorities.numpy()
  if len(values) != int(tf.size(keys)):
    raise ValueError(
        f'update_priorities: {int(tf.size(keys))} keys but {len(values)} '
        f'priorities (table {table!r}).')
  bad = np.flatnonzero(~np.isfinite(values))
  if bad.size:
    raise ValueError(
        f'update_priorities: priorities[{bad[0]}] = {values[bad[0]]!r} is '
        f'not finite ({bad.size} such values; table {table!r}); a '
        'diverging loss gives NaN TD errors.')
