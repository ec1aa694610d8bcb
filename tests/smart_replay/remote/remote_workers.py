"""Processes of the multi-process tests: actors and learners.

Each function runs in a process started with multiprocessing's `spawn`
method, builds its own client-mode `ReplayBufferManager`, and reports
through a queue. Kept apart from the tests so spawned children import
only this module.
"""

import os
import signal
import traceback

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from tf_agents.trajectories import trajectory  # pylint: disable=g-import-not-at-top

import smart_replay
from smart_replay.utils import ports
from tests import testing

SEQUENCE_LENGTH = 2


def free_port_pair():
  """A port P such that P and P + 1 (the control port) are free, outside the
  ephemeral range (where any client connection may take them meanwhile)."""
  return ports.free_port_pair()


def data_spec():
  """The spec every process of a test shares (a real TF-Agents spec)."""
  return testing.collect_data_spec(testing.make_env())


def client(address, **kwargs):
  """A connected client-mode manager; returns `(manager, observer)`."""
  kwargs.setdefault('write_timeout_s', 10.0)
  kwargs.setdefault('sample_timeout_s', 10.0)
  manager = smart_replay.ReplayBufferManager(
      data_spec=data_spec(), server_address=address, **kwargs)
  _, observer = manager.connect()
  return manager, observer


def long_episode_steps(count, seed=0):
  """`count` trajectories of one long episode from a real environment."""
  from tf_agents.environments import random_py_environment  # pylint: disable=g-import-not-at-top
  from tf_agents.trajectories import trajectory  # pylint: disable=g-import-not-at-top
  env = random_py_environment.RandomPyEnvironment(
      testing.OBSERVATION_SPEC, testing.ACTION_SPEC,
      episode_end_probability=0.0, min_duration=10_000, max_duration=10_000,
      seed=seed)
  policy = testing.make_policy(env, seed)
  time_step, steps = env.reset(), []
  for _ in range(count):
    action = policy.action(time_step)
    next_time_step = env.step(action.action)
    steps.append(trajectory.from_transition(time_step, action, next_time_step))
    time_step = next_time_step
  return steps


def write_steps(address, seed, steps, results):
  """An actor: a real TF-Agents Actor writing `steps` steps, then flushing.

  Reports `(seed, fingerprints of the items it should have stored, counters
  with the number of steps the Actor produced)`.
  """
  manager, observer = client(address)
  record = testing.run_actor(observer, steps, seed=seed)
  observer.flush()
  items = testing.expected_items(record.steps, SEQUENCE_LENGTH)
  counters = dict(observer.counters(), recorded_steps=len(record.steps))
  results.put((seed, [testing.item_fingerprint(i) for i in items], counters))
  manager.close()


def write_until_killed(address, seed, started):
  """An actor that writes forever; sets `started` once items are stored."""
  manager, observer = client(address)
  env = testing.make_env(seed, max_duration=1000)
  policy = testing.make_policy(env, seed)
  time_step = env.reset()
  written = 0
  while True:  # Killed by the test, mid-episode.
    action = policy.action(time_step)
    next_time_step = env.step(action.action)
    observer(trajectory.from_transition(time_step, action, next_time_step))
    time_step = next_time_step
    written += 1
    if written == 200:
      observer.flush()
      started.set()
  del manager


def sample_everything(address, expected_items, results):
  """A learner: waits for `expected_items`, samples every item, reports.

  Reports `(num_frames, {key: fingerprint}, checkpoint path)`; the
  checkpoint is asked of the server through client mode.
  """
  manager, _ = client(address)
  size = manager.num_frames()
  seen = testing.sample_all_items(manager, batch_size=64)
  path = manager.checkpoint(extra={'learner': 'done'})
  results.put((size, seen, path))
  manager.close()


def _phases(manager, observer, seed, go, report, phases, steps, wait_s):
  """Writes `steps` steps and flushes, `phases` times, waiting for `go`
  between phases; calls `report(phase, counters)` after each. The manager
  flushes (its observer, then counts what a restart of its server lost), so
  each report holds every loss so far."""
  env = testing.make_env(seed)
  policy = testing.make_policy(env, seed)
  for phase in range(phases):
    if phase:
      go.wait(wait_s)
      go.clear()
    testing.run_actor(observer, steps, env=env, policy=policy)
    manager.flush()
    report(phase, observer.counters())


def phased_actor(address, seed, go, results, phases=2, steps=150):
  """An actor in phases (`_phases`); reports `(phase, counters)`."""
  manager, observer = client(address, reconnect_timeout_s=60.0)
  _phases(manager, observer, seed, go, lambda *report: results.put(report),
          phases, steps, wait_s=120)
  manager.close()


def kill(process):
  """kill -9 and reap."""
  os.kill(process.pid, signal.SIGKILL)
  process.join(30)


def coordinated_save_and_die(addresses, step, results):
  """A learner that writes a coordinated checkpoint of a sharded buffer and
  SIGKILLs itself at `step` of it (`backends.coordinated_checkpoints.STEPS`)."""
  from smart_replay.backends import coordinated_checkpoints  # pylint: disable=g-import-not-at-top

  def die(reached):
    if reached == step:
      results.put(('dying', reached))
      results.close()
      results.join_thread()  # The message is sent before the kill.
      os.kill(os.getpid(), signal.SIGKILL)
  coordinated_checkpoints._fault_point = die  # pylint: disable=protected-access
  manager, _ = client(addresses, actor_id=0)
  results.put(('saving', step))
  results.put(('survived', manager.checkpoint(extra={'step': step})))


def pinned_actor(addresses, actor_id, go, results, phases=3, steps=100):
  """An actor of a sharded buffer (or one server), pinned by `actor_id`, in
  phases (`_phases`); reports `(actor_id, phase, counters)`."""
  manager, observer = client(addresses, actor_id=actor_id,
                             reconnect_timeout_s=120.0)
  _phases(manager, observer, actor_id, go,
          lambda *report: results.put((actor_id, *report)), phases, steps,
          wait_s=240)
  manager.close()


def sample_until_stopped(addresses, stop, per_source, results):
  """A learner: samples batches until `stop` is set, adding the elements of
  each source (shard) to `per_source`; reports the buffer's stats."""
  manager, _ = client(addresses, actor_id=0, sample_timeout_s=120.0)
  batches = iter(manager.get_dataset(batch_size=32, num_steps=2))
  while not stop.is_set():
    _, info = next(batches)
    sources = info.shard.numpy()[:, 0]
    with per_source.get_lock():
      for source in sources.tolist():
        per_source[source] += 1
  results.put(('learner', manager.stats()))
  manager.close()


def resending_actor(address, seed, steps, halfway, restarted, results):
  """An actor that writes through a server restart and sends again what the
  server lacks.

  A real TF-Agents Actor writes `steps` steps in two halves; `halfway` is set
  after the first (flushed). After the second it waits for `restarted`, and
  the manager's flush then sends again what the restarted server lacks (if
  its watcher did not already). Reports `(seed, fingerprints of the items it
  should have stored, counters)`.
  """
  manager, observer = client(address, write_timeout_s=120.0,
                             reconnect_timeout_s=180.0)
  env = testing.make_env(seed, max_duration=40)
  policy = testing.make_policy(env, seed)
  first = testing.run_actor(observer, steps // 2, env=env, policy=policy)
  observer.flush()
  halfway.set()
  second = testing.run_actor(observer, steps - steps // 2, env=env,
                             policy=policy)
  assert restarted.wait(240)
  manager.flush()  # Sends again, if the watcher has not yet.
  items = testing.expected_items(first.steps + second.steps, SEQUENCE_LENGTH)
  results.put((seed, [testing.item_fingerprint(i) for i in items],
               observer.counters()))
  manager.close()


def journaled_actor(address, journal_dir, seed, steps, go, results):
  """An actor keeping what it sends in `journal_dir` (synced at each flush):
  writes `steps` steps and flushes, reports `('written', fingerprints of
  their items, counters)`, then waits for `go` and does it again; until
  killed (or `go` times out); an error is reported as `('error', its
  traceback, None)`."""
  try:
    manager, observer = client(address, journal_dir=journal_dir,
                               journal='always', reconnect_timeout_s=120.0)
  except BaseException:  # pylint: disable=broad-except
    results.put(('error', traceback.format_exc(), None))
    raise
  env = testing.make_env(seed, max_duration=40)
  policy = testing.make_policy(env, seed)
  while True:
    record = testing.run_actor(observer, steps, env=env, policy=policy)
    observer.flush()
    items = testing.expected_items(record.steps, SEQUENCE_LENGTH)
    results.put(('written', [testing.item_fingerprint(i) for i in items],
                 observer.counters()))
    if not go.wait(240):
      break
    go.clear()
  manager.close()
