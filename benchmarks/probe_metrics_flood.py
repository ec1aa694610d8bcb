"""Probe (security review 2, M3): a scrape during a metrics connection flood.

An in-process `ReplayServer` on a tiny buffer serves its metrics with a
token. A flooder process keeps `--connections` half-sent requests open to
the metrics port from `--sources` loopback addresses (127.0.0.1, 127.0.0.2,
...); by default it opens a new one for every one the server closes, as a
persistent attacker would. Before it starts, and again while it runs, this
process scrapes `/metrics` with the token from `--scrape_from` every 0.5 s
for `--duration_s`, writes one checkpoint, and samples its own Python
threads and open files. `--nofile` sets this process's soft limit of open
files (1024 is a common default; the review's server 3 ran with it).
Prints one JSON line per phase: scrape latency (median, 90th percentile,
max), failed scrapes and why, the checkpoint's duration, the peak threads
and files, and the connections the endpoint refused (when it counts them).

Run: .venv/bin/python benchmarks/probe_metrics_flood.py [--connections=1500]
  [--sources=1] [--scrape_from=127.0.0.1] [--nofile=1024]
(about a minute on 2 cores). To compare with an older version of the
endpoint, run it from a checkout of that version (e.g. `git archive`), whose
`smart_replay` comes first on `sys.path`.
"""

import argparse
import http.client
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import smart_replay
from smart_replay.remote import metrics
from smart_replay.remote import replay_server
from smart_replay_benchmarks import workload as wl_lib

_TOKEN = 'probe-metrics-flood-token'

# Keeps argv[2] connections to 127.0.0.1:argv[1] open from the addresses
# argv[3:], each with a half-sent request; with argv[4] == '1' (reopen),
# replaces every connection the server closes. Non-blocking connects: a
# server that stopped accepting does not stall the others.
_FLOODER = r"""
import errno, selectors, socket, sys
port, total, reopen = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == '1'
sources = sys.argv[4:]
selector = selectors.DefaultSelector()
request = b'GET /metrics HTTP/1.1\r\nHost: x\r\n'

def open_one(k):
  s = socket.socket()
  s.setblocking(False)
  s.bind((sources[k % len(sources)], 0))
  error = s.connect_ex(('127.0.0.1', port))
  if error not in (0, errno.EINPROGRESS):
    s.close()
    return
  selector.register(s, selectors.EVENT_WRITE, k)

for k in range(total):
  open_one(k)
print('started', flush=True)
while True:
  for key, events in selector.select(timeout=1.0):
    s, k = key.fileobj, key.data
    if events & selectors.EVENT_WRITE:
      if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
        try:
          s.send(request)
          selector.modify(s, selectors.EVENT_READ, k)
          continue
        except OSError:
          pass
    else:
      try:
        if s.recv(1):
          continue
      except OSError:
        pass
    selector.unregister(s)
    s.close()
    if reopen:
      open_one(k)
"""


def _open_files() -> int:
  return len(os.listdir('/proc/self/fd'))


class _Peaks:
  """The most Python threads and open files seen until `stop`."""

  def __init__(self):
    self.threads, self.files = 0, 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self._thread.start()

  def _sample(self) -> None:
    while not self._stop.wait(0.1):
      self.threads = max(self.threads, threading.active_count())
      try:
        files = _open_files()
      except OSError:  # EMFILE: every file the limit allows is open.
        files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
      self.files = max(self.files, files)

  def stop(self) -> None:
    self._stop.set()
    self._thread.join()


def _scrape(port: int, source: str) -> tuple:
  """One scrape with the token: (seconds, None) or (seconds, why failed)."""
  start = time.monotonic()
  connection = http.client.HTTPConnection(
      '127.0.0.1', port, timeout=30, source_address=(source, 0))
  try:
    connection.request('GET', '/metrics',
                       headers={'Authorization': f'Bearer {_TOKEN}'})
    response = connection.getresponse()
    body = response.read()
    failed = (None if response.status == 200 and b'smart_replay_up 1' in body
              else f'HTTP {response.status}')
  except OSError as e:  # Refused, reset, timed out.
    failed = type(e).__name__
  finally:
    connection.close()
  return time.monotonic() - start, failed


def _phase(name: str, server, endpoint, args) -> None:
  peaks = _Peaks()
  seconds, failures = [], {}
  checkpoint = None
  start = time.monotonic()
  while time.monotonic() - start < args.duration_s:
    took, failed = _scrape(endpoint.port, args.scrape_from)
    if failed:
      failures[failed] = failures.get(failed, 0) + 1
    else:
      seconds.append(took)
    if checkpoint is None and time.monotonic() - start > args.duration_s / 2:
      began = time.monotonic()
      try:
        server.checkpoint(reason='probe')
        checkpoint = round(time.monotonic() - began, 3)
      except Exception as e:  # pylint: disable=broad-except
        checkpoint = (f'{type(e).__name__} after '
                      f'{time.monotonic() - began:.1f} s')
    time.sleep(max(0.0, 0.5 - took))
  peaks.stop()
  values = np.array(seconds) if seconds else np.array([np.nan])
  print(json.dumps({
      'phase': name, 'scrapes_ok': len(seconds),
      'scrape_median_ms': round(1e3 * float(np.median(values)), 1),
      'scrape_p90_ms': round(1e3 * float(np.percentile(values, 90)), 1),
      'scrape_max_ms': round(1e3 * float(np.max(values)), 1),
      'scrapes_failed': failures, 'checkpoint_s': checkpoint,
      'peak_threads': peaks.threads, 'peak_open_files': peaks.files,
      'refused_connections': getattr(endpoint, 'refused_connections',
                                     'not counted')}), flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--connections', type=int, default=1500)
  parser.add_argument('--sources', type=int, default=1,
                      help='loopback addresses the flood comes from')
  parser.add_argument('--scrape_from', default='127.0.0.1')
  parser.add_argument('--nofile', type=int, default=1024,
                      help="this process's soft limit of open files")
  parser.add_argument('--duration_s', type=float, default=20.0)
  parser.add_argument('--settle_s', type=float, default=10.0,
                      help='seconds the flood runs before measuring')
  parser.add_argument('--noreopen', action='store_true',
                      help='open the connections once, not again')
  args = parser.parse_args()
  _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
  print(json.dumps({'endpoint': metrics.__file__, 'nofile': args.nofile,
                    'connections': args.connections,
                    'sources': args.sources,
                    'scrape_from': args.scrape_from,
                    'reopen': not args.noreopen}), flush=True)
  with tempfile.TemporaryDirectory() as root:
    manager = smart_replay.ReplayBufferManager(
        data_spec=wl_lib.data_spec(4), capacity=1000, sequence_length=2,
        checkpoint_dir=os.path.join(root, 'buffer'))
    server = replay_server.ReplayServer(manager)
    server.start()
    endpoint = metrics.MetricsEndpoint(server, port=0, token=_TOKEN)
    try:
      for _ in range(5):  # Warm-up.
        _scrape(endpoint.port, args.scrape_from)
      _phase('no flood', server, endpoint, args)
      sources = [f'127.0.0.{k + 1}' for k in range(args.sources)]
      flooder = subprocess.Popen(
          [sys.executable, '-c', _FLOODER, str(endpoint.port),
           str(args.connections), '0' if args.noreopen else '1', *sources],
          stdout=subprocess.PIPE, text=True,
          preexec_fn=lambda: resource.setrlimit(
              resource.RLIMIT_NOFILE, (hard, hard)))
      try:
        assert flooder.stdout.readline() == 'started\n'
        time.sleep(args.settle_s)
        _phase(f'flood of {args.connections} from {args.sources} '
               'address(es)', server, endpoint, args)
      finally:
        flooder.kill()
        flooder.wait()
    finally:
      endpoint.close()
      server.close(final_checkpoint=False)


if __name__ == '__main__':
  main()
