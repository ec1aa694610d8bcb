"""Prometheus metrics of a served buffer (`smart-replay-serve --metrics_port`).

`MetricsEndpoint` serves `http://<host>:<port>/metrics` from its own
`prometheus_client` registry (two servers in one process do not collide).
Every scrape reads the buffer's state at that moment (a custom collector; no
polling thread):

- per table (label `table`): `smart_replay_table_items`,
  `smart_replay_table_max_items`, `smart_replay_table_inserts_total`,
  `smart_replay_table_samples_total` (the rate limiter's completed inserts
  and samples), `smart_replay_table_insert_blocked_seconds` /
  `..._sample_blocked_seconds` (how long inserting / sampling has been
  blocked by the rate limiter right now, 0 when not) and
  `smart_replay_table_insert_wait_seconds_total` / `..._sample_wait_...`
  (Reverb's total time callers waited);
- checkpoints: `smart_replay_checkpoint_age_seconds` (since the newest
  checkpoint was written or resumed), `smart_replay_checkpoint_duration_seconds`
  (the last one written), `smart_replay_checkpoints_total` (written since
  serving began), `smart_replay_checkpoint_failing` (1 while scheduled
  checkpoints fail);
- `smart_replay_reverb_connections`: established TCP connections to the
  Reverb port, read from Linux's `/proc/net/tcp{,6}`. Reverb 0.14 does not
  tell writers from samplers, so this counts every connected client (actors,
  learners, and this server's own client);
- `smart_replay_server_info` (labels `address`, `layout`, `checkpoint_dir`)
  and `smart_replay_up` (0 when the buffer did not answer the scrape).

The endpoint binds to 127.0.0.1 unless told otherwise: unlike Reverb, it can.
"""

import errno
import time
from typing import Any, Iterator, Optional

import prometheus_client
from prometheus_client import core as prometheus_core

from smart_replay import errors
from smart_replay.manager import facade as manager_lib

# (metric name, kind, where stats() has it, help text), per table.
_TABLE_METRICS = (
    ('items', 'gauge', ('items',), 'Items the table holds.'),
    ('max_items', 'gauge', ('max_size',), "The table's capacity, in items."),
    ('inserts', 'counter', ('inserts',),
     "Inserts completed (the rate limiter's count)."),
    ('samples', 'counter', ('samples',), "Samples completed (the rate "
     "limiter's count; a dataset's prefetch included)."),
    ('insert_blocked_seconds', 'gauge',
     ('rate_limiter', 'insert_blocked_for_s'), 'How long inserts have been '
     'blocked by the rate limiter (0 when not blocked).'),
    ('sample_blocked_seconds', 'gauge',
     ('rate_limiter', 'sample_blocked_for_s'), 'How long samples have been '
     'blocked by the rate limiter (0 when not blocked).'),
    ('insert_wait_seconds', 'counter',
     ('rate_limiter', 'insert_wait_total_s'),
     'Total time inserts waited on the rate limiter.'),
    ('sample_wait_seconds', 'counter',
     ('rate_limiter', 'sample_wait_total_s'),
     'Total time samples waited on the rate limiter.'),
)


def reverb_connections(port: int) -> Optional[int]:
  """Counts established TCP connections to a local port.

  Args:
    port: the listening port (the Reverb server's).

  Returns:
    The number of server-side sockets of `port` in state ESTABLISHED, or None
    where `/proc/net/tcp` cannot be read.
  """
  count, readable = 0, False
  for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    try:
      with open(table) as f:
        lines = f.readlines()[1:]
    except OSError:
      continue
    readable = True
    for line in lines:
      fields = line.split()
      local_port = int(fields[1].rsplit(':', 1)[1], 16)
      if local_port == port and fields[3] == '01':  # TCP_ESTABLISHED
        count += 1
  return count if readable else None


class _Collector:
  """Reads the served buffer at every scrape."""

  def __init__(self, server: Any):
    self._server = server

  def collect(self) -> Iterator[Any]:
    """Yields the metric families (see the module docstring)."""
    server = self._server
    manager = server.manager
    up = prometheus_core.GaugeMetricFamily(
        'smart_replay_up', '1 if the buffer answered this scrape.')
    try:
      stats = manager.stats()
    except (errors.WaitTimeoutError, errors.ServerUnavailableError,
            errors.ManagerStateError):
      up.add_metric([], 0)
      yield up
      return
    up.add_metric([], 1)
    yield up
    info = prometheus_core.InfoMetricFamily(
        'smart_replay_server', 'The served buffer.')
    info.add_metric([], {'address': server.address,
                         'layout': manager.layout or '',
                         'checkpoint_dir': manager.checkpoint_dir or ''})
    yield info
    yield from _table_families(stats['tables'])
    yield from _checkpoint_families(server.schedule, time.monotonic())
    connections = reverb_connections(server.port)
    if connections is not None:
      family = prometheus_core.GaugeMetricFamily(
          'smart_replay_reverb_connections', 'Established TCP connections to '
          'the Reverb port: every connected client (writers and samplers).')
      family.add_metric([], connections)
      yield family


class _ShardsCollector:
  """Reads a sharded buffer, through a client manager, at every scrape."""

  def __init__(self, manager: Any):
    self._manager = manager

  def collect(self) -> Iterator[Any]:
    """Yields the families of a sharded buffer (see `MetricsEndpoint`)."""
    up = prometheus_core.GaugeMetricFamily(
        'smart_replay_up', '1 if the buffer answered this scrape.')
    try:
      stats = self._manager.stats()
    except (errors.WaitTimeoutError, errors.ManagerStateError):
      up.add_metric([], 0)
      yield up
      return
    up.add_metric([], 1)
    yield up
    yield from _table_families(stats['tables'])  # Summed over the shards.
    shard_up = prometheus_core.GaugeMetricFamily(
        'smart_replay_shard_up', '1 if the shard answered this scrape.',
        labels=['shard', 'address'])
    down = prometheus_core.CounterMetricFamily(
        'smart_replay_shard_sampling_down_events', 'Times the live datasets '
        "of this process saw the shard go down.", labels=['shard', 'address'])
    per_table = {name: (prometheus_core.GaugeMetricFamily if kind == 'gauge'
                        else prometheus_core.CounterMetricFamily)(
                            f'smart_replay_shard_table_{name}', text,
                            labels=['shard', 'address', 'table'])
                 for name, kind, keys, text in _TABLE_METRICS[:4]}
    for k, shard in enumerate(stats.get('shards', [])):
      labels = [str(k), shard['address']]
      shard_up.add_metric(labels, 1 if shard['up'] else 0)
      if shard.get('sampling'):
        down.add_metric(labels, shard['sampling']['down_events'])
      for table, counters in shard['tables'].items():
        for name, _, keys, _ in _TABLE_METRICS[:4]:
          if counters.get(keys[0]) is not None:
            per_table[name].add_metric(labels + [table],
                                       float(counters[keys[0]]))
    yield shard_up
    yield down
    yield from per_table.values()

def _table_families(tables: Any) -> Iterator[Any]:
  for name, kind, keys, text in _TABLE_METRICS:
    make = (prometheus_core.GaugeMetricFamily if kind == 'gauge' else
            prometheus_core.CounterMetricFamily)
    family = make(f'smart_replay_table_{name}', text, labels=['table'])
    for table, stats in tables.items():
      value = stats
      for key in keys:  # e.g. stats['rate_limiter']['insert_wait_total_s']
        value = value.get(key) if value is not None else None
      if value is not None:
        family.add_metric([table], float(value))
    yield family


def _checkpoint_families(schedule: Any, now: float) -> Iterator[Any]:
  if schedule.last_time is not None and schedule.last_checkpoint:
    age = prometheus_core.GaugeMetricFamily(
        'smart_replay_checkpoint_age_seconds', 'Seconds since the newest '
        'checkpoint was written (or resumed at start).')
    age.add_metric([], max(now - schedule.last_time, 0.0))
    yield age
  if schedule.last_duration_s is not None:
    duration = prometheus_core.GaugeMetricFamily(
        'smart_replay_checkpoint_duration_seconds', 'How long the last '
        'checkpoint written took.')
    duration.add_metric([], schedule.last_duration_s)
    yield duration
  written = prometheus_core.CounterMetricFamily(
      'smart_replay_checkpoints', 'Checkpoints written since serving began.')
  written.add_metric([], schedule.written)
  yield written
  failing = prometheus_core.GaugeMetricFamily(
      'smart_replay_checkpoint_failing', '1 while scheduled checkpoints '
      'fail.')
  failing.add_metric([], 0 if schedule.failing_since is None else 1)
  yield failing


class MetricsEndpoint:
  """Serves a buffer's metrics over HTTP; a context manager.

  Args:
    server: a started `ReplayServer`; or a connected client-mode manager of
      a sharded buffer, for the whole buffer's tables (summed) and each
      shard's: `smart_replay_shard_up`, `smart_replay_shard_table_{items,
      max_items,inserts_total,samples_total}` (labels `shard`, `address`,
      `table`) and `smart_replay_shard_sampling_down_events_total` (how often
      this process's datasets saw the shard go down).
    port: the HTTP port; 0 picks a free one.
    host: the address to bind (127.0.0.1: this machine only; '0.0.0.0'
      for a Prometheus on another machine).

  Raises:
    ValueError: if `port` is out of range or already in use (named).
  """

  def __init__(self, server: Any, *, port: int, host: str = '127.0.0.1'):
    if isinstance(port, bool) or not isinstance(port, int) or not (
        0 <= port <= 65535):
      raise ValueError(f'metrics_port must be an integer in [0, 65535], got '
                       f'{port!r}.')
    self._registry = prometheus_client.CollectorRegistry(auto_describe=False)
    self._registry.register(
        _ShardsCollector(server)
        if isinstance(server, manager_lib.ReplayBufferManager)
        else _Collector(server))
    try:
      self._httpd, self._thread = prometheus_client.start_http_server(
          port, addr=host, registry=self._registry)
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        raise ValueError(f'metrics_port {port} on {host} is already in use; '
                         'pass another port, or 0 to pick a free one.') from e
      raise
    self._host = host
    self._closed = False

  @property
  def port(self) -> int:
    """The port the endpoint listens on."""
    return self._httpd.server_port

  @property
  def url(self) -> str:
    """The metrics URL, e.g. `http://127.0.0.1:9090/metrics`."""
    return f'http://{self._host}:{self.port}/metrics'

  def close(self) -> None:
    """Stops serving (safe to call twice)."""
    if self._closed:
      return
    self._closed = True
    self._httpd.shutdown()
    self._httpd.server_close()
    self._thread.join(timeout=10)

  def __enter__(self) -> 'MetricsEndpoint':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
