"""TF-Agents' Atari DQN example: stock Reverb against the manager.

Two programs train DQN on Pong, each in its own process, in turns (stock,
ours, stock, ours, ...), with the same short configuration:

* 'stock': TF-Agents' own `dqn_train_eval_atari.py` from its wheel, with its
  Reverb table, server, replay buffer and observer (`dqn_stock_main`; only
  its environment loader is replaced, as in ours);
* 'ours': `examples/dqn_atari.py`, the same example with that replay block
  swapped for `ReplayBufferManager` (frames stored once, in zstd).

The rate is TF-Agents' own: the train steps per second its
`StepPerSecondLogTrigger` logs every 100 train steps (each train step also
collects 4 environment steps through the observer and samples a batch of
32), the first interval (graph tracing) left out. The wall time of each
program is reported beside it.
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

from absl import logging

from smart_replay_benchmarks import dqn_stock_main

SIDES = ('stock', 'ours')
RESULT_FILE = 'dqn_atari_benchmark.json'
_HERE = os.path.dirname(os.path.abspath(__file__))
_RATE = re.compile(r'Step: (\d+), ([0-9.]+) steps/sec')
_TIMEOUT_S = 3600.0


def example_path() -> str:
  """`examples/dqn_atari.py` of this checkout."""
  return os.path.join(os.path.dirname(_HERE), 'examples', 'dqn_atari.py')


def command(side: str, root_dir: str, *, iterations: int,
            initial_collect_steps: int, replay_capacity: int) -> List[str]:
  """The command line of one side's program.

  Args:
    side: 'stock' or 'ours'.
    root_dir: the program's `--root_dir` (emptied first by `run`).
    iterations: train iterations (`--num_iterations`).
    initial_collect_steps: random steps collected before training.
    replay_capacity: the buffer's capacity.

  Returns:
    The argument list, Python first.

  Raises:
    ValueError: if `side` is unknown.
  """
  if side not in SIDES:
    raise ValueError(f'side must be one of {SIDES}, got {side!r}')
  program = dqn_stock_main.__file__ if side == 'stock' else example_path()
  return [sys.executable, program, f'--root_dir={root_dir}',
          f'--num_iterations={iterations}', '--eval_interval=0',
          f'--gin_bindings=train_eval.initial_collect_steps='
          f'{initial_collect_steps}',
          f'--gin_bindings=train_eval.replay_capacity={replay_capacity}']


def rates(log: str) -> List[float]:
  """The train steps/s a program logged, the first interval left out.

  Args:
    log: the program's output (absl logs to stderr).

  Returns:
    Every logged rate after the first.
  """
  return [float(m.group(2)) for m in _RATE.finditer(log)][1:]


def run(output_dir: str, *, repeats: int = 2, iterations: int = 1000,
        initial_collect_steps: int = 2000, replay_capacity: int = 100_000
        ) -> Dict[str, Any]:
  """Runs both programs `repeats` times in turns; writes `RESULT_FILE`.

  Args:
    output_dir: where each program's root folder goes (deleted after it)
      and the results; created if missing.
    repeats: runs of each side.
    iterations: train iterations per run (at least 200: a rate is logged
      every 100 and the first is left out).
    initial_collect_steps: random steps collected before training.
    replay_capacity: the buffers' capacity.

  Returns:
    `{'config', 'sides': {side: {'rates': [...], 'median', 'wall_seconds':
    [...]}}, 'ratio'}`: `ratio` is ours' median over stock's.

  Raises:
    ValueError: if `iterations` < 200 or `repeats` < 1.
    RuntimeError: if a program fails or logs no rate; names it and shows
      the end of its output.
  """
  if iterations < 200:
    raise ValueError(f'iterations must be >= 200 (a rate is logged every '
                     f'100 train steps), got {iterations!r}')
  if repeats < 1:
    raise ValueError(f'repeats must be >= 1, got {repeats!r}')
  config = {'iterations': iterations, 'repeats': repeats,
            'initial_collect_steps': initial_collect_steps,
            'replay_capacity': replay_capacity}
  sides = {side: {'rates': [], 'wall_seconds': []} for side in SIDES}
  environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  os.makedirs(output_dir, exist_ok=True)
  for repeat in range(repeats):
    for side in SIDES:
      root = os.path.join(output_dir, f'dqn_{side}')
      shutil.rmtree(root, ignore_errors=True)
      args = command(side, root, iterations=iterations,
                     initial_collect_steps=initial_collect_steps,
                     replay_capacity=replay_capacity)
      logging.info('dqn_atari %s, run %d/%d: %s', side, repeat + 1, repeats,
                   ' '.join(args[1:]))
      started = time.monotonic()
      try:
        done = subprocess.run(args, capture_output=True, text=True,
                              timeout=_TIMEOUT_S, check=False,
                              cwd=output_dir, env=environment)
      finally:
        shutil.rmtree(root, ignore_errors=True)
      wall = time.monotonic() - started
      output = done.stdout + done.stderr
      found = rates(output)
      if done.returncode != 0 or not found:
        raise RuntimeError(
            f'the {side} DQN program exited with {done.returncode} and '
            f'logged {len(found)} rate(s) after the first: '
            f'{" ".join(args)}\n{output[-4000:]}')
      sides[side]['rates'] += found
      sides[side]['wall_seconds'].append(wall)
      logging.info('dqn_atari %s, run %d/%d: median %.2f train steps/s, '
                   '%.0f s', side, repeat + 1, repeats,
                   statistics.median(found), wall)
  for side in sides.values():
    side['median'] = statistics.median(side['rates'])
  results = {'config': config, 'sides': sides,
             'ratio': sides['ours']['median'] / sides['stock']['median']}
  with open(os.path.join(output_dir, RESULT_FILE), 'w') as f:
    json.dump(results, f, indent=2)
  return results


def format_table(results: Dict[str, Any]) -> str:
  """The rates of both programs and their ratio, as markdown.

  Args:
    results: what `run` returned.

  Returns:
    A table: per side the median, the range and the wall times; then the
    ratio and whether ours is at least as fast.
  """
  config = results['config']
  lines = ['| TF-Agents Atari DQN (Pong) | train steps/s, median | range '
           '| wall s per run |', '| --- | --- | --- | --- |']
  for name, label in (('stock', 'stock Reverb (its own example)'),
                      ('ours', 'ReplayBufferManager (examples/dqn_atari.py)')):
    side = results['sides'][name]
    lines.append(f"| {label} | {side['median']:.2f} | "
                 f"{min(side['rates']):.2f}-{max(side['rates']):.2f} | "
                 + ', '.join(f'{w:.0f}' for w in side['wall_seconds']) + ' |')
  verdict = 'at least as fast' if results['ratio'] >= 1 else 'SLOWER'
  lines += ['', f"ours / stock: {results['ratio']:.3f}x ({verdict}); "
            f"{config['repeats']} runs each in turns, {config['iterations']:,} "
            f"train iterations after {config['initial_collect_steps']:,} "
            'random steps, rates logged every 100 train steps (the first '
            'left out).']
  return '\n'.join(lines)

