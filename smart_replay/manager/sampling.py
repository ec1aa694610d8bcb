"""Sampling a manager's buffer: datasets, prefill checks and priorities.

`Sampling` is the part of `ReplayBufferManager` behind `get_dataset`,
`check_prefill`, `update_priorities` and `priority_update_fn`: it builds
datasets from the running buffer's client and frozen config.
"""

from typing import Any, Callable, List, Optional, Union

from absl import logging
import tensorflow as tf

from smart_replay import errors
from smart_replay.backends import base as backend_lib
from smart_replay.config import buffer as config_lib
from smart_replay.config import limiter
from smart_replay.config import mixable
from smart_replay.manager import manager_options
from smart_replay.manager import state as state_lib
from smart_replay.sampling import batcher as batcher_lib
from smart_replay.sampling import dataset as dataset_lib
from smart_replay.sampling import fraction_schedule as schedule_lib
from smart_replay.sampling import replay_info as replay_info_lib
from smart_replay.sampling import sources as sources_lib
from smart_replay.server import local_server as server_lib
from smart_replay.utils import checks


class Sampling:
  """Datasets, prefill checks and priority updates of a buffer.

  Args:
    state: the manager's state.
    options: the manager's options (timeouts, `num_envs`).
    backend: where the buffer lives (its config before a start).
  """

  def __init__(self, state: state_lib.State,
               options: manager_options.ManagerOptions,
               backend: backend_lib.Backend):
    self._state, self._options, self._backend = state, options, backend

  def _running(self) -> state_lib.Running:
    return self._state.require(started=True, where=self._backend.where)

  def _config(self) -> config_lib.BufferConfig:
    """The config; client mode must be connected to know it."""
    if self._backend.config is None:
      self._running()
    return self._backend.config

  def get_dataset(self, batch_size: int, num_steps: Optional[int] = None, *,
                  table_name: Optional[str] = None,
                  sample_timeout_s: Optional[float] = None,
                  train_step: Optional[tf.Variable] = None,
                  as_train_kwargs: bool = False,
                  prefetch: int = 2,
                  starter_fraction: Union[
                      None, float, schedule_lib.FractionSchedule] = None
                  ) -> tf.data.Dataset:
    """Returns a `tf.data.Dataset` of batches for `tf_agents.train.Learner`.

    Args:
      batch_size: items per batch.
      num_steps: steps per sample; a divisor of the table's sequence length
        (default: the whole item). Episode items are always sampled whole.
      table_name: the table to sample; default the first table.
      sample_timeout_s: overrides the manager's `sample_timeout_s`.
      train_step: the train-step variable (e.g.
        `train_utils.create_train_step()`) that anneals the
        importance-sampling beta of a prioritized table with
        `importance_beta_final`; required there, ignored elsewhere.
      as_train_kwargs: yield `(dict(experience=trajectory, weights=w), info)`
        for `Learner(use_kwargs_in_agent_train=True,
        run_optimizer_variable_init=False)`, so the agent's loss is weighted
        by the importance-sampling weights (TF-Agents 0.19 cannot pre-create
        optimizer variables from such a dataset).
      prefetch: batches to prefetch.
      starter_fraction: mix the manager's read-only starter table (see
        `starter_dir`) into each batch: each element comes from it with this
        probability, a number in [0, 1] or a `FractionSchedule` (annealed
        by `train_step`); importance weights are then computed per source
        (see `sampling.batcher`). None: only `table_name`.

    Returns:
      A dataset of `(Trajectory[batch, num_steps, ...], ReplayInfo)`; the
      `ReplayInfo` holds the item keys, Reverb's sample info, the
      importance-sampling `weight` (1 unless the table is prioritized), the
      `mask` of episode padding and the `source` of each element (`ONLINE`
      or `STARTER`), each `[batch, num_steps]`. When no
      sample is allowed within the timeout, its iterator raises a
      `tf.errors.OpError` naming the table and its state, and the same
      iterator samples again on the next call. For tables with
      `max_times_sampled` the last batch before a timeout may be smaller
      than `batch_size` (no sampled item is dropped, and the Reverb prefetch
      depth is one batch).

    Raises:
      ValueError: if an argument is invalid or the table is unknown, or the
        starter cannot be mixed into the table (names what differs).
      ManagerStateError: if the manager is not started, or
        `starter_fraction` is given without a starter.
    """
    running = self._running()
    config = running.config.table(table_name)
    timeout = (self._options.timeouts.sample_timeout_s
               if sample_timeout_s is None else sample_timeout_s)
    checks.positive('sample_timeout_s', timeout)
    plan = batcher_lib.SamplingPlan(batch_size=batch_size, timeout_s=timeout,
                                    prefetch=prefetch)
    sources = self._online_sources(running, config, timeout)
    betas = [replay_info_lib.beta(config, train_step)]
    schedule = schedule_lib.as_schedule(starter_fraction)
    shares = None
    if schedule is not None:
      starter = self._starter_source(running, config, schedule)
      sources.append(starter)
      betas.append(replay_info_lib.beta(starter.table, train_step))
      schedule.tensor(train_step)  # Raises now if it needs the step.
      def shares():
        fraction = tf.cast(schedule.tensor(train_step), tf.float64)
        return tf.stack([1.0 - fraction, fraction])
    if len(sources) > 1:
      for source in sources:
        mixable.check_drawable(source.table, 'the sampled table')
    dataset, batcher = dataset_lib.make_dataset(
        sources, plan=plan, num_steps=num_steps, shares=shares,
        output=dataset_lib.Output(
            layout=running.config.step_layout, betas=betas,
            as_train_kwargs=as_train_kwargs),
        closed_message=(f'the buffer ({self._backend.where}) was closed (its '
                        'manager closed); make a new dataset from a new '
                        'manager.'))
    running.batchers.add(batcher, self._backend.where)
    for shard, state in enumerate(self._backend.server_states()):
      if not state['up']:  # Down when the dataset was made.
        batcher.source_down(shard)
    return dataset

  def _online_sources(self, running: state_lib.Running, config: Any,
                      timeout_s: float) -> List[sources_lib.Source]:
    """The buffer's own table: on its server, or on every shard."""
    if not running.shards:
      return [sources_lib.Source(running.client.server_address, config,
                                 group=replay_info_lib.ONLINE)]
    sizes = []
    for client, _ in running.shards:
      try:
        info = server_lib.server_info(client, min(timeout_s, 5.0))
        sizes.append(int(info[config.name].current_size))
      except errors.WaitTimeoutError as e:
        logging.warning('Shard %s did not say its size (%s): it starts with '
                        'no share of the batches.', client.server_address, e)
        sizes.append(None)
    mixable.check_drawable(config, 'the sharded table')
    return [sources_lib.Source(client.server_address, config,
                               group=replay_info_lib.ONLINE, shard=k,
                               size=size, watched=True)
            for k, ((client, _), size) in enumerate(zip(running.shards,
                                                        sizes))]

  def _starter_source(self, running: state_lib.Running, config: Any,
                      schedule: schedule_lib.FractionSchedule
                      ) -> sources_lib.Source:
    """The read-only starter table, checked against the buffer's."""
    starter = running.starter
    if starter is None:
      raise errors.ManagerStateError(
          f'starter_fraction={schedule.describe()} needs a starter table: '
          'build the manager with starter_dir=<a starter buffer> (a client '
          'of standalone servers serves it in its own process).')
    mixable.check_mixable(
        config, starter.table, online_spec=running.config.data_spec,
        starter_spec=starter.config.data_spec,
        online_layout=running.config.step_layout.describe(),
        starter_layout=starter.config.step_layout.describe())
    return sources_lib.Source(starter.client.server_address, starter.table,
                              group=replay_info_lib.STARTER,
                              size=starter.items)

  def check_prefill(self, steps: int, *, num_envs: Optional[int] = None
                    ) -> None:
    """Checks that `steps` more env steps can be written with nothing sampling.

    A `samples_per_insert` (or queue) rate limiter blocks inserts once the
    table is ahead of the sampler by its error buffer, so a starter buffer
    written before any learner runs would wait forever in plain Reverb. Call
    this before such a prefill; it counts, per table, the most items `steps`
    steps can make (sequence tables: one per `min(stride, length)` steps;
    episode tables: one per step at worst) and compares them with what the
    limiter still allows with nothing sampling. Before the buffer is started
    it assumes an empty buffer (check before
    `create_replay_buffer(overwrite=True)` so a bad config never replaces
    data).

    Args:
      steps: env steps about to be written (over all environments).
      num_envs: environments writing them; default the manager's `num_envs`.

    Raises:
      ValueError: if `steps` is not a positive integer.
      PrefillWouldBlockError: naming each table that would block, how many
        items it would take and how to fix the config.
      ManagerStateError: if the manager is closed (or, in client mode, not
        connected).
    """
    checks.positive('steps', steps, integer=True)
    config = self._config()
    running = self._state.require(started=None, where=self._backend.where)
    counts = (running.table_stats(self._options.timeouts.connect_timeout_s)
              if running is not None else dict.fromkeys(
                  config.table_names, {'inserts': 0, 'samples': 0, 'items': 0}))
    problems = limiter.prefill_problems(
        config.tables, counts, steps=steps,
        streams=num_envs or self._options.writes.num_envs or 1)
    if problems:
      raise errors.PrefillWouldBlockError(
          f'writing {steps} env steps with nothing sampling would block:\n  '
          + '\n  '.join(problems))

  def update_priorities(self, keys: Any, priorities: Any, *,
                        table_name: Optional[str] = None,
                        shards: Any = None) -> None:
    """Sets the priorities of sampled items (prioritized replay).

    Works eagerly and inside a `tf.function`, e.g. a Learner's
    `after_train_strategy_step_fn` (see `priority_update_fn`). Each new
    priority is `|priority| + priority_epsilon` of the table, so TD errors
    can be passed directly and no item's priority is zero; the table's
    largest priority so far becomes the priority of new items (unless the
    table sets `initial_priority`). Keys no longer in the table are ignored.

    Args:
      keys: uint64 item keys, `[batch]`, or `[batch, num_steps]` as in
        `ReplayInfo.key` (the first column is used).
      priorities: `[batch]` new priorities (e.g. absolute TD errors).
      table_name: the table; default the first prioritized table.
      shards: a sharded buffer: the shard of each key, `ReplayInfo.shard`
        (`[batch]` or `[batch, num_steps]`); each key's priority is set on
        the shard that holds it. Ignored for one server.

    Raises:
      ValueError: if the table is unknown or not prioritized, or (eagerly)
        if the shapes differ or a priority is not finite; in a `tf.function`
        the shape and finiteness checks raise `InvalidArgumentError`.
      ManagerStateError: if the manager is not started.
    """
    running = self._running()
    config = running.config.prioritized_table(table_name)
    if running.shards:
      if shards is None:
        raise ValueError(
            'update_priorities of a sharded buffer needs shards= (the '
            'ReplayInfo.shard of each key) to find the shard holding it.')
      running.counts.priorities.update_sharded(
          [tf_client for _, tf_client in running.shards], config, keys,
          priorities, shards, serving=self._state.serving,
          where=[c.server_address for c, _ in running.shards],
          up=running.shards_up)
      return
    running.counts.priorities.update(
        running.tf_client, config, keys, priorities,
        serving=self._state.serving, where=self._backend.where)

  def priority_update_fn(self, *, table_name: Optional[str] = None,
                         priorities_fn: Optional[Callable[[Any], Any]] = None
                         ) -> Callable[[Any, Any], None]:
    """Returns a Learner `after_train_strategy_step_fn` updating priorities.

    Args:
      table_name: the prioritized table; default the first one.
      priorities_fn: maps the agent's `LossInfo` to `[batch]` priorities;
        default `loss_info.extra.td_error` (DQN agents).

    Returns:
      `fn(experience, loss_info)`, where `experience` is the
      `(experience, ReplayInfo)` pair the Learner sampled, for
      `tf_agents.train.Learner(after_train_strategy_step_fn=...)` (with or
      without `use_kwargs_in_agent_train`). Elements of a starter mixed in
      keep their priority (it is read-only); a sharded buffer's keys are
      updated on their shards.

    Raises:
      ValueError: if the table is unknown or not prioritized.
      ManagerStateError: in client mode, if not connected.
    """
    config = self._config().prioritized_table(table_name)
    running = self._state.running
    sharded = bool(running and running.shards)
    priorities_fn = priorities_fn or (lambda loss: loss.extra.td_error)
    # Named as the Learner passes them with use_kwargs_in_agent_train=True.
    def update(experience, loss_info):
      _, info = experience  # (experience, ReplayInfo)
      online = tf.equal(info.source[:, 0], replay_info_lib.ONLINE)
      mine = lambda t: tf.boolean_mask(t, online)
      self.update_priorities(
          mine(info.key[:, 0]), mine(priorities_fn(loss_info)),
          table_name=config.name,
          shards=mine(info.shard[:, 0]) if sharded else None)
    return update
