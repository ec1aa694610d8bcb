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
  and `smart_replay_up` (0 when the buffer did not answer the scrape);
- `smart_replay_metrics_refused_connections_total`: connections this
  endpoint refused for its connection caps (below).

The endpoint of a `ReplayServer` that serves without authentication (neither
`token` nor `tls_client_ca_file`) hides this machine's paths, host name and
ports from its labels, as the control service hides them from its answers
without a token (`handlers.redact`): `checkpoint_dir="<buffer>"` and
`address="<address>"`. (The sharded view of a client keeps each shard's
`address`: the addresses that process was given to connect to.)

The endpoint binds to 127.0.0.1 unless told otherwise: unlike Reverb, it can.
Bound to any other address it needs authentication (protected mode): a bearer
token (`token`; Prometheus: `authorization: {credentials_file: <file>}`) or
client certificates (`tls_client_ca_file`; Prometheus: `tls_config`), unless
`allow_unauthenticated_remote=True`. `tls_cert_file` and `tls_key_file` serve
HTTPS. Every connection has `timeout_s` for its TLS handshake and then
`timeout_s` to send its whole request, so slow or half-sent requests do not
pile up threads. At most `max_connections` (16) connections are served at
once, and `max_connections_per_peer` (4) from one client address; others are
closed as soon as they are accepted, so a flood of connections holds at most
16 threads and sockets (it can still keep scrapes out while it lasts: see
`http_server`). The serving itself is `http_server.serve`'s.
"""

import os
import time
from typing import Any, Callable, Iterator, Optional, Union

import prometheus_client
from prometheus_client import core as prometheus_core

from smart_replay import errors
from smart_replay.manager import facade as manager_lib
from smart_replay.remote import handlers
from smart_replay.remote import http_server

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
  """Reads the served buffer at every scrape.

  Args:
    server: the `ReplayServer`.
    redact: hide the buffer's path and the server's address from the labels
      (for scrapes nobody authenticated).
  """

  def __init__(self, server: Any, *, redact: bool):
    self._server = server
    self._redact = redact

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
    address, checkpoint_dir = server.address, manager.checkpoint_dir or ''
    if self._redact:  # Host name and port; the path as '<buffer>'.
      address = '<address>'
      if checkpoint_dir:
        checkpoint_dir = handlers.redact(checkpoint_dir, root=checkpoint_dir)
    info.add_metric([], {'address': address, 'layout': manager.layout or '',
                         'checkpoint_dir': checkpoint_dir})
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


class _RefusedCollector:
  """Reports the connections the endpoint refused for its caps."""

  def __init__(self, refused: Callable[[], int]):
    self._refused = refused

  def collect(self) -> Iterator[Any]:
    """Yields `smart_replay_metrics_refused_connections_total`."""
    family = prometheus_core.CounterMetricFamily(
        'smart_replay_metrics_refused_connections', 'Connections this '
        'metrics endpoint closed unserved: too many at once, or from one '
        'client address.')
    family.add_metric([], self._refused())
    yield family


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


_PathLike = Union[str, 'os.PathLike[str]']

# How Prometheus sends a bearer token, for the protected-mode error.
_TOKEN_HINT = ('Prometheus sends it with `authorization: {credentials_file: '
               '<file>}`')


class MetricsEndpoint:
  """Serves a buffer's metrics over HTTP(S); a context manager.

  Args:
    server: a started `ReplayServer`; or a connected client-mode manager of
      a sharded buffer, for the whole buffer's tables (summed) and each
      shard's: `smart_replay_shard_up`, `smart_replay_shard_table_{items,
      max_items,inserts_total,samples_total}` (labels `shard`, `address`,
      `table`) and `smart_replay_shard_sampling_down_events_total` (how often
      this process's datasets saw the shard go down).
    port: the HTTP port; 0 picks a free one.
    host: the address to bind (127.0.0.1: this machine only; '0.0.0.0'
      for a Prometheus on another machine, which needs `token` or
      `tls_client_ca_file`, see `allow_unauthenticated_remote`).
    token: a shared secret; when given, every request must carry the header
      `Authorization: Bearer <token>` or gets a 401 (Prometheus:
      `authorization: {credentials_file: <file>}` in the scrape config).
    tls_cert_file: a PEM certificate (chain) to serve HTTPS; goes with
      `tls_key_file`.
    tls_key_file: the certificate's unencrypted PEM private key.
    tls_client_ca_file: PEM certificate(s) of a CA; when given, clients must
      present a certificate it signed (mutual TLS; Prometheus: `tls_config`
      with `cert_file` and `key_file`). Needs `tls_cert_file`.
    allow_unauthenticated_remote: serve on a non-loopback `host` with
      neither `token` nor `tls_client_ca_file` (anyone who can reach the
      port reads the metrics, with the buffer's path and the server's
      address hidden, as without authentication on any host).
    timeout_s: seconds a connection has for its TLS handshake, then for
      sending its whole request, and for each write of the response; a
      slower or half-sent request is dropped and its thread ends.
    max_connections: connections served at once (a thread each); others
      are closed as soon as they are accepted, before any TLS handshake.
    max_connections_per_peer: connections served at once from one client
      address (IPv6: one /64), at most `max_connections`.

  Raises:
    ValueError: if an argument is invalid (named): `port` out of range or
      already in use, a `host` that does not resolve to a local address, an
      empty `token`, only one of `tls_cert_file` / `tls_key_file`, a missing
      or unloadable TLS file, a non-positive `timeout_s`, a connection cap
      that is not a positive integer or a per-peer cap above
      `max_connections`; or a non-loopback `host` without authentication
      (protected mode).
  """

  def __init__(self, server: Any, *, port: int, host: str = '127.0.0.1',
               token: Optional[str] = None,
               tls_cert_file: Optional[_PathLike] = None,
               tls_key_file: Optional[_PathLike] = None,
               tls_client_ca_file: Optional[_PathLike] = None,
               allow_unauthenticated_remote: bool = False,
               timeout_s: float = 10.0,
               max_connections: int = http_server.MAX_CONNECTIONS,
               max_connections_per_peer: int = (
                   http_server.MAX_CONNECTIONS_PER_PEER)):
    authenticated = token is not None or tls_client_ca_file is not None
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(
        _ShardsCollector(server)
        if isinstance(server, manager_lib.ReplayBufferManager)
        else _Collector(server, redact=not authenticated))
    self._registry = registry
    self._http = http_server.serve(
        prometheus_client.make_wsgi_app(registry), name='metrics', port=port,
        host=host, token=token, tls_cert_file=tls_cert_file,
        tls_key_file=tls_key_file, tls_client_ca_file=tls_client_ca_file,
        allow_unauthenticated_remote=allow_unauthenticated_remote,
        timeout_s=timeout_s, token_hint=_TOKEN_HINT,
        max_connections=max_connections,
        max_connections_per_peer=max_connections_per_peer)
    registry.register(_RefusedCollector(
        lambda: self._http.refused_connections))

  @property
  def port(self) -> int:
    """The port the endpoint listens on."""
    return self._http.port

  @property
  def refused_connections(self) -> int:
    """Connections refused for the caps since serving began."""
    return self._http.refused_connections

  @property
  def url(self) -> str:
    """The metrics URL, e.g. `http://127.0.0.1:9090/metrics` (https: TLS)."""
    return self._http.url('/metrics')

  def close(self) -> None:
    """Stops serving (safe to call twice)."""
    self._http.close()

  def __enter__(self) -> 'MetricsEndpoint':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

