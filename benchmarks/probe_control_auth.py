"""Probe (issue 32): what the control service's token and TLS cost a call.

One in-process `ReplayServer` per mode (no token, a token, a token over TLS)
on a tiny buffer; a `ControlClient` calls 'info' (the call every client and
every shard monitor makes) `--calls` times in a row, after a warm-up, and
the modes take turns in rounds so that the machine's load falls on each
alike. A server without a token also hides its paths from every answer,
which costs time of its own; so two bare `ControlServer`s with a trivial
method, without and with the token, isolate what the token check costs.
Prints the median and 99th percentile latency of each mode and the ratios
to the mode without a token, as JSON lines.

Run: .venv/bin/python benchmarks/probe_control_auth.py [--calls=2000]
(about a minute on 2 cores; TLS needs the `openssl` command).
"""

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

import smart_replay
from smart_replay.remote import replay_server
from smart_replay.control import channel as control_lib
from smart_replay.control import access as control_access
from smart_replay_benchmarks import workload as wl_lib


def _certificates(root: str) -> dict:
  """A throwaway CA and a server certificate for 127.0.0.1 (openssl)."""
  run = lambda *args: subprocess.run(['openssl', *args], cwd=root,
                                     check=True, capture_output=True)
  run('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1',
      '-subj', '/CN=probe-ca', '-keyout', 'ca.key', '-out', 'ca.pem')
  run('req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=127.0.0.1',
      '-keyout', 'server.key', '-out', 'server.csr')
  with open(os.path.join(root, 'san.cnf'), 'w') as f:
    f.write('subjectAltName=IP:127.0.0.1,DNS:localhost\n')
  run('x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey',
      'ca.key', '-CAcreateserial', '-days', '1', '-extfile', 'san.cnf',
      '-out', 'server.pem')
  return {name: os.path.join(root, name)
          for name in ('ca.pem', 'server.pem', 'server.key')}


def _server(root: str, name: str, access: control_access.ControlAccess):
  manager = smart_replay.ReplayBufferManager(
      data_spec=wl_lib.data_spec(4), capacity=1000, sequence_length=2,
      checkpoint_dir=os.path.join(root, name))
  return replay_server.ReplayServer(manager, access=access).start()


def _timed_calls(client: control_lib.ControlClient, calls: int) -> np.ndarray:
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
    modes = {'no token': (control_access.ControlAccess(auth=False), None)}
    modes['token'] = (control_access.ControlAccess(), None)
    if shutil.which('openssl'):
      files = _certificates(root)
      modes['token + TLS'] = (control_access.ControlAccess(
          tls_cert_file=files['server.pem'],
          tls_key_file=files['server.key']), files['ca.pem'])
    servers, clients = {}, {}
    for name, (access, ca_file) in modes.items():
      servers[name] = _server(root, name.replace(' ', '_'), access)
      clients[name] = control_lib.ControlClient(
          f'127.0.0.1:{servers[name].control_port}',
          credentials=control_access.ClientCredentials.resolve(
              token_file=servers[name].token_file, tls_ca_file=ca_file,
              environ={}))
    for name, token in (('bare, no token', None), ('bare, token', 'secret')):
      modes[name] = None
      servers[name] = control_lib.ControlServer(
          {'info': lambda request: {'ok': 1}}, port=0, token=token,
          access=control_access.ControlAccess(auth=token is not None))
      clients[name] = control_lib.ControlClient(
          f'127.0.0.1:{servers[name].port}',
          credentials=control_access.ClientCredentials(token=token))
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
