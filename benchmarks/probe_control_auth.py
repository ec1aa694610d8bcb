"""Probe (issues 32, 40): what the control service's tokens and TLS cost a
call.

One in-process `ReplayServer` per mode (no token over plain TCP; the
default: tokens over TLS with the server's own certificate) on a tiny
buffer; a `ControlClient` calls 'info' (the call every client and
every shard monitor makes) `--calls` times in a row, after a warm-up, and
the modes take turns in rounds so that the machine's load falls on each
alike. A server without a token also hides its paths from every answer,
which costs time of its own; so two bare `ControlServer`s with a trivial
method, without and with the token, isolate what the token check costs.
Prints the median and 99th percentile latency of each mode and the ratios
to the mode without a token, as JSON lines.

Run: .venv/bin/python benchmarks/probe_control_auth.py [--calls=2000]
(about a minute on 2 cores).
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np

import smart_replay
from smart_replay.remote import replay_server
from smart_replay.control import client as control_client
from smart_replay.control import server as control_server
from smart_replay.control import access as control_access
from smart_replay.control import credentials as credentials_lib
from smart_replay_benchmarks import workload as wl_lib


def _server(root: str, name: str, access: control_access.ControlAccess):
  manager = smart_replay.ReplayBufferManager(
      data_spec=wl_lib.data_spec(4), capacity=1000, sequence_length=2,
      checkpoint_dir=os.path.join(root, name))
  return replay_server.ReplayServer(manager, access=access).start()


def _timed_calls(client: control_client.ControlClient, calls: int) -> np.ndarray:
  seconds = np.empty(calls)
  for i in range(calls):
    began = time.perf_counter()
    client.call('info', timeout_s=10)
    seconds[i] = time.perf_counter() - began
  return seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--calls', type=int, default=2000)
  parser.add_argument('--rounds', type=int, default=4)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as root:
    modes = {'no token': control_access.ControlAccess(auth=False),
             'tokens + TLS': control_access.ControlAccess()}
    servers, clients = {}, {}
    for name, access in modes.items():
      servers[name] = _server(root, name.replace(' ', '_'), access)
      clients[name] = control_client.ControlClient(
          f'127.0.0.1:{servers[name].control_port}',
          credentials=credentials_lib.ClientCredentials.resolve(
              token_file=servers[name].token_file, environ={}))
    for name, access in (('bare, no token',
                          control_access.ControlAccess(auth=False)),
                         ('bare, tokens + TLS', control_access.ControlAccess())):
      modes[name] = access
      secrets = access.secrets(os.path.join(root, name.replace(' ', '_')))
      servers[name] = control_server.ControlServer(
          {'info': lambda request: {'ok': 1}}, port=0, access=access,
          secrets=secrets)
      clients[name] = control_client.ControlClient(
          f'127.0.0.1:{servers[name].port}',
          credentials=credentials_lib.ClientCredentials.resolve(
              token_file=secrets.operator_file, environ={}))
    for name in modes:
      _timed_calls(clients[name], 200)  # Warm-up: the channel, the TLS.
    seconds = {name: [] for name in modes}
    for _ in range(args.rounds):
      for name in modes:
        seconds[name].append(_timed_calls(clients[name],
                                          args.calls // args.rounds))
    for name in modes:
      values = np.concatenate(seconds[name])
      base = np.median(np.concatenate(
          seconds['bare, no token' if name.startswith('bare') else
                  'no token']))
      print(json.dumps({
          'mode': name, 'calls': len(values),
          'median_ms': round(1e3 * float(np.median(values)), 3),
          'p99_ms': round(1e3 * float(np.percentile(values, 99)), 3),
          'median_vs_no_token': round(float(np.median(values) / base), 3)}),
            flush=True)
    for name in modes:
      clients[name].close()
      if name.startswith('bare'):
        servers[name].stop()
      else:
        servers[name].close(final_checkpoint=False)


if __name__ == '__main__':
  main()
