r"""Runs the server, remote and sharded test files on a busy host, N times.

A busy host, made here on loopback only: connection churners open and close
loopback TCP connections as fast as they can (every one takes a port from the
kernel's ephemeral range, where a port chosen by `bind(0)` lives too), and CPU
burners keep every core busy. Meanwhile pytest runs the test files that start
servers (`--files`), `--runs` times in a row. Every loop is bounded: the load
stops when the runs end, at Ctrl-C, or after `--max_minutes`.

  python benchmarks/stress_busy_host.py --runs=5 \
      --output=benchmark_results/stress_busy_host.json

It prints a line per run (passed/failed, time, the load's connections per
second, an ETA) and writes the figures as JSON (and the whole pytest output of
each failed run beside it, `<output>.run<N>.log`); the exit status is 0 only
if every run passed. Not part of CI (about 65 minutes for 5 runs on 2 cores
with the default load).
"""

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags

FILES = ('tests/smart_replay/remote/test_replay_server.py',
         'tests/smart_replay/remote/test_remote.py',
         'tests/smart_replay/remote/test_sharded_remote.py',
         'tests/smart_replay/backends/test_sharded.py')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

flags.DEFINE_integer('runs', 5, 'How many times to run the test files.',
                     lower_bound=1)
flags.DEFINE_list('files', list(FILES), 'Test files, from the repository '
                  'root.')
flags.DEFINE_integer('churners', 2, 'Processes opening and closing loopback '
                     'connections.', lower_bound=0)
flags.DEFINE_integer('burners', None, 'Processes spinning on a core '
                     '(default: one per core).', lower_bound=0)
flags.DEFINE_float('max_minutes', 120.0, 'Stop the load (and the runs) after '
                   'this long.', lower_bound=1.0)
flags.DEFINE_string('output', None, 'Write the figures here as JSON.')
FLAGS = flags.FLAGS


def churn(stop, deadline, counter):
  """Opens and closes loopback connections to a listener of its own until
  `stop` is set or `deadline` (time.time()) passes."""
  listener = socket.socket()
  listener.bind(('127.0.0.1', 0))
  listener.listen(1024)
  address = listener.getsockname()

  def accept():
    while not stop.is_set():
      try:
        conn, _ = listener.accept()
        conn.close()
      except OSError:
        return
  threading.Thread(target=accept, daemon=True).start()
  opened = 0
  while not stop.is_set() and time.time() < deadline:
    try:
      with socket.create_connection(address, timeout=1.0):
        opened += 1
    except OSError:  # Out of ports for a moment: the point of the exercise.
      time.sleep(0.01)
    if opened % 500 == 0:
      with counter.get_lock():
        counter.value += 500
  listener.close()


def burn(stop, deadline):
  """Spins until `stop` is set or `deadline` passes."""
  x = 0
  while not stop.is_set() and time.time() < deadline:
    for _ in range(100_000):
      x = (x * 31 + 7) % 1_000_003


def _run_tests(files, timeout_s, log_path):
  """Runs pytest on `files`; returns (passed, seconds, summary line). The
  whole output of a failed run goes to `log_path` (if not None)."""
  started = time.monotonic()
  try:
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-rfE', '-p',
         'no:cacheprovider', *files], cwd=ROOT, capture_output=True,
        text=True, timeout=timeout_s, check=False)
  except subprocess.TimeoutExpired:
    return False, time.monotonic() - started, f'timed out after {timeout_s} s'
  lines = [l for l in result.stdout.splitlines() if l.strip()]
  failed = [l for l in lines if l.startswith(('FAILED', 'ERROR'))]
  summary = (lines[-1] if lines else 'no output').strip('= ')
  if result.returncode != 0 and log_path:
    with open(log_path, 'w') as f:
      f.write(result.stdout + result.stderr)
    summary += f'; the whole output is in {log_path}'
  return (result.returncode == 0, time.monotonic() - started,
          summary + ''.join(f'\n    {l}' for l in failed))


def main(argv):
  del argv
  missing = [f for f in FLAGS.files if not os.path.isfile(
      os.path.join(ROOT, f))]
  if missing:
    raise app.UsageError(f'--files: no such test files {missing}')
  context = multiprocessing.get_context('spawn')
  stop = context.Event()
  counter = context.Value('q', 0)
  deadline = time.time() + FLAGS.max_minutes * 60
  burners = os.cpu_count() if FLAGS.burners is None else FLAGS.burners
  load = ([context.Process(target=churn, args=(stop, deadline, counter))
           for _ in range(FLAGS.churners)] +
          [context.Process(target=burn, args=(stop, deadline))
           for _ in range(burners)])
  if FLAGS.output:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
  for process in load:
    process.start()
  print(f'Load: {FLAGS.churners} connection churners, {burners} CPU burners '
        f'on {os.cpu_count()} cores; {FLAGS.runs} runs of {len(FLAGS.files)}'
        ' test files.', flush=True)
  runs = []
  began = time.monotonic()
  try:
    for run in range(1, FLAGS.runs + 1):
      before = counter.value
      remaining = deadline - time.time()
      if remaining <= 0:
        print('Stopped: --max_minutes reached.', flush=True)
        break
      log_path = FLAGS.output and f'{os.path.splitext(FLAGS.output)[0]}' \
          f'.run{run}.log'
      passed, seconds, summary = _run_tests(FLAGS.files, remaining, log_path)
      rate = (counter.value - before) / seconds
      runs.append({'run': run, 'passed': passed, 'seconds': round(seconds, 1),
                   'connections_per_s': round(rate), 'summary': summary})
      elapsed = time.monotonic() - began
      eta = elapsed / run * (FLAGS.runs - run)
      print(f'Run {run}/{FLAGS.runs}: {"passed" if passed else "FAILED"} in '
            f'{seconds:.0f} s ({summary}); load {rate:,.0f} connections/s; '
            f'ETA {eta / 60:.1f} min.', flush=True)
  except KeyboardInterrupt:
    print('Interrupted: stopping the load.', file=sys.stderr)
    return 130
  finally:
    stop.set()
    for process in load:
      process.join(timeout=10)
      if process.is_alive():
        process.kill()
  figures = {
      'runs': runs, 'passed': sum(r['passed'] for r in runs),
      'files': FLAGS.files, 'churners': FLAGS.churners, 'burners': burners,
      'cores': os.cpu_count(), 'connections_total': counter.value,
      'load_avg': os.getloadavg()}
  print(f'{figures["passed"]} of {len(runs)} runs passed; '
        f'{counter.value:,} loopback connections opened.', flush=True)
  if FLAGS.output:  # Its folder was made before the runs.
    with open(FLAGS.output, 'w') as f:
      json.dump(figures, f, indent=2)
  return 0 if figures['passed'] == FLAGS.runs else 1


if __name__ == '__main__':
  signal.signal(signal.SIGTERM, signal.default_int_handler)
  app.run(main)
