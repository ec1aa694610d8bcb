"""Atari benchmark: real ALE frames, stock TF-Agents against our layouts.

One run compares, side by side (`atari_sides.SIDES`), the stock TF-Agents
and Reverb path with our `ReplayBufferManager` storing each frame once (the
frame stack found by its shape, in zstd), one item per window and in packed
items of 64 steps, and for reference the same in zlib (as before zstd) and
ours with `frame_stack=False`. The stream is real: `atari_frames` plays the
game (Pong by default) once per run, before anything is measured, and caches
it in the output folder; every side gets its frames on the workload's stack
axis (`uint8[4, 84, 84]`, or TF-Agents' `uint8[84, 84, 4]`). A run is one
game and one axis; `run_all` runs several and `atari_report.format_summary`
sets them side by side.

Each side runs in its own spawned process, one after the other, so its
memory is its own and no side competes with another for the CPUs. Measured
per side: server memory per step (the slope of the process's RSS over the
second half of the writing), insert steps/s, sampled windows/s (batch 32,
num_steps 2, `next()` for `sample_seconds`), checkpoint bytes, checkpoint and
restore seconds, and the size curve (RSS growth per step at the curve's
sizes). `atari_report` turns them into ratios against stock, a table and a
chart.
"""

import dataclasses
import importlib.metadata
import json
import multiprocessing
import os
import platform
import shutil
import time
import traceback
from typing import Any, Dict, List, Sequence, Tuple

from absl import logging

from smart_replay_benchmarks import atari_frames
from smart_replay_benchmarks import atari_report
from smart_replay_benchmarks import atari_sides
from smart_replay_benchmarks import extras

DEFAULT_SIDES = atari_sides.SIDES
_SIDE_TIMEOUT_S = 3600.0


@dataclasses.dataclass(frozen=True)
class AtariWorkload:
  """What the Atari benchmark writes and samples.

  Attributes:
    steps: steps written into each side (boundary steps included).
    sides: the compared sides, `atari_sides.SIDES` names; 'stock' first.
    curve_sizes: buffer sizes (steps, each at most `steps`) at which the
      RSS growth per step is read; `steps // 2` and `steps` are always read.
    sample_seconds: seconds of sampling timed per side.
    seed: the seed of the stream.
    game: the ALE game played (e.g. 'Pong', 'Breakout').
    stack_axis: where the observation's 4 frames are: 0 (`uint8[4, 84,
      84]`, Gymnasium's `FrameStackObservation`) or -1 (`uint8[84, 84, 4]`,
      TF-Agents' `FrameStack4`).
  """
  steps: int = 20_000
  sides: Tuple[str, ...] = DEFAULT_SIDES
  curve_sizes: Tuple[int, ...] = ()
  sample_seconds: float = 5.0
  seed: int = 0
  game: str = atari_frames.GAME
  stack_axis: int = 0

  def __post_init__(self):
    object.__setattr__(self, 'sides', tuple(self.sides))
    object.__setattr__(self, 'curve_sizes',
                       tuple(sorted(set(self.curve_sizes))))
    if isinstance(self.steps, bool) or not isinstance(self.steps, int) or (
        self.steps < 4):
      raise ValueError(f'AtariWorkload.steps must be an integer >= 4, got '
                       f'{self.steps!r}.')
    unknown = [s for s in self.sides if s not in atari_sides.SIDES]
    if unknown or not self.sides or self.sides[0] != 'stock' or len(
        set(self.sides)) != len(self.sides):
      raise ValueError(
          f'AtariWorkload.sides must start with stock and name each side '
          f'once, of {atari_sides.SIDES}; got {list(self.sides)}.')
    if len(self.sides) < 2:
      raise ValueError('AtariWorkload.sides needs stock and at least one of '
                       'ours to compare.')
    bad = [s for s in self.curve_sizes if s < 1 or s > self.steps]
    if bad:
      raise ValueError(f'AtariWorkload.curve_sizes must be between 1 and '
                       f'steps={self.steps}; got {bad}.')
    try:
      atari_frames.check_stack_axis(self.stack_axis)
    except ValueError as e:
      raise ValueError(f'AtariWorkload.{e}') from None
    if not self.sample_seconds > 0:
      raise ValueError(f'AtariWorkload.sample_seconds must be > 0, got '
                       f'{self.sample_seconds!r}.')

  @property
  def marks(self) -> Tuple[int, ...]:
    """Steps written at which the RSS is read: the curve, half and end."""
    return tuple(sorted(set(self.curve_sizes) |
                        {self.steps // 2, self.steps}))


def _side_main(connection, side, frames_folder, steps, marks, sample_seconds,
               work, stack_axis, verbosity) -> None:
  """Measures one side (in a spawned process) and sends its result, or the
  error's traceback."""
  logging.set_verbosity(verbosity)
  try:
    result = atari_sides.measure(side, frames_folder, steps, marks,
                                 sample_seconds, work, stack_axis)
    connection.send(('ok', result))
  except BaseException:  # pylint: disable=broad-except
    connection.send(('error', traceback.format_exc()))


def measure_side(side: str, workload: AtariWorkload, frames_folder: str,
                 work: str) -> Dict[str, Any]:
  """Runs `atari_sides.measure` for `side` in a fresh spawned process.

  Args:
    side: the side.
    workload: the workload.
    frames_folder: the cached stream.
    work: the side's (emptied) checkpoint folder; deleted afterwards.

  Returns:
    What `atari_sides.measure` returned.

  Raises:
    RuntimeError: if the side failed (with its traceback) or its process
      died.
    TimeoutError: if it takes longer than an hour.
  """
  shutil.rmtree(work, ignore_errors=True)
  os.makedirs(work)
  context = multiprocessing.get_context('spawn')
  connection, child = context.Pipe(duplex=False)
  process = context.Process(
      target=_side_main, args=(child, side, frames_folder, workload.steps,
                               workload.marks, workload.sample_seconds, work,
                               workload.stack_axis, logging.get_verbosity()))
  process.start()
  child.close()
  try:
    if not connection.poll(_SIDE_TIMEOUT_S):
      raise TimeoutError(f'the {side} side did not finish within '
                         f'{_SIDE_TIMEOUT_S:g} s.')
    try:
      status, value = connection.recv()
    except EOFError:
      process.join(10)
      raise RuntimeError(f'the {side} side\'s process exited with code '
                         f'{process.exitcode}; see its log above.') from None
    if status != 'ok':
      raise RuntimeError(f'the {side} side failed:\n{value}')
    return value
  except KeyboardInterrupt:  # Abandon the side at once.
    process.kill()
    raise
  finally:
    process.join(120)
    if process.is_alive():
      process.kill()
      process.join(10)
    shutil.rmtree(work, ignore_errors=True)


def _memory(result: Dict[str, Any], steps: int) -> Dict[str, Any]:
  """A side's memory figures from its RSS readings."""
  rss = {int(k): v for k, v in result['rss'].items()}
  half = steps // 2
  slope = (rss[steps] - rss[half]) / (steps - half)
  sizes = sorted(rss)
  return {
      'slope_bytes_per_step': slope,
      'growth_bytes_per_step': (rss[steps] - result['base_rss']) / steps,
      'projected_1m_steps_bytes': slope * 1e6,
      'projected_10m_steps_bytes': slope * 1e7,
      'curve': {'sizes': sizes,
                'bytes_per_step': [(rss[size] - result['base_rss']) / size
                                   for size in sizes],
                # Each step between two readings: flat when memory is linear.
                'marginal_bytes_per_step': [
                    (rss[b] - rss[a]) / (b - a)
                    for a, b in zip(sizes, sizes[1:])]}}


def result_name(workload: AtariWorkload) -> str:
  """The name of a run's files: `atari_<game>_axis0` or
  `atari_<game>_axis-1`."""
  return f'atari_{workload.game.lower()}_axis{workload.stack_axis}'


def run(workload: AtariWorkload, output_dir: str) -> Dict[str, Any]:
  """Runs the Atari benchmark; writes `<result_name>.json` and `.png`.

  Args:
    workload: what to write and sample.
    output_dir: where the results, the cached stream and the (deleted
      afterwards) checkpoints go; created if missing.

  Returns:
    The results (also in `output_dir/<result_name>.json`): the workload,
    the machine, per side its measurements and `memory` (slope, growth,
    projection, curve), `ratios` (see `atari_report.ratios`) and `name`,
    the files' name (`result_name`).

  Raises:
    ImportError: if psutil or matplotlib (the `bench` extra) is missing;
      checked before anything runs.
    RuntimeError, TimeoutError: if a side fails (see `measure_side`).
  """
  extras.check_installed('psutil', 'matplotlib')
  os.makedirs(output_dir, exist_ok=True)
  began = time.monotonic()
  arrays = atari_frames.cached_frames(output_dir, workload.steps,
                                      workload.seed, workload.game)
  episodes = atari_frames.episodes(arrays)
  del arrays  # Each side loads its own copy.
  frames_folder = atari_frames.cache_folder(output_dir, workload.seed,
                                            workload.game)
  results: Dict[str, Any] = {
      'workload': dataclasses.asdict(workload),
      'stream': {'game': workload.game, 'episodes_ended': episodes,
                 'stack_axis': workload.stack_axis,
                 'observation': 'uint8[{}, {}, {}]'.format(
                     *atari_frames.observation_shape(workload.stack_axis)),
                 'raw_bytes_per_step': atari_frames.raw_bytes_per_step(),
                 'seconds_to_generate_or_load': time.monotonic() - began},
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version(),
                  'dm_reverb': importlib.metadata.version('dm-reverb'),
                  'tensorflow': importlib.metadata.version('tensorflow'),
                  'tf_agents': importlib.metadata.version('tf-agents'),
                  'ale_py': importlib.metadata.version('ale-py')},
      'sides': {}}
  measured = time.monotonic()
  try:
    for index, side in enumerate(workload.sides):
      result = measure_side(side, workload, frames_folder,
                            os.path.join(output_dir, 'atari_work', side))
      result['memory'] = _memory(result, workload.steps)
      result['rss'] = {str(k): v for k, v in result['rss'].items()}
      results['sides'][side] = result
      elapsed = time.monotonic() - measured
      logging.info(
          '%s side %d/%d %s: %.0f steps/s, %.0f windows/s, %.0f B/step; '
          'ETA %.0f s', result_name(workload), index + 1,
          len(workload.sides), side,
          result['insert_steps_per_s'], result['sample_windows_per_s'],
          result['memory']['slope_bytes_per_step'],
          elapsed / (index + 1) * (len(workload.sides) - index - 1))
  finally:  # Also when a side fails or is interrupted.
    shutil.rmtree(os.path.join(output_dir, 'atari_work'), ignore_errors=True)
  results['ratios'] = atari_report.ratios(results)
  results['name'] = result_name(workload)
  name = os.path.join(output_dir, results['name'])
  with open(name + '.json', 'w') as f:
    json.dump(results, f, indent=2)
  atari_report.plot(results, name + '.png')
  return results


def run_all(workload: AtariWorkload, games: Sequence[str],
            stack_axes: Sequence[int], output_dir: str
            ) -> List[Dict[str, Any]]:
  """Runs `workload` on every game and stack axis, one `run` each.

  Args:
    workload: what to write and sample (its game and axis are replaced).
    games: the ALE games, in order.
    stack_axes: 0 and/or -1, measured in turn for each game.
    output_dir: as for `run`; the summary goes to `atari_summary.json`.

  Returns:
    Each run's results, game by game, axis by axis.
  """
  results = []
  for game in games:
    for stack_axis in stack_axes:
      results.append(run(dataclasses.replace(
          workload, game=game, stack_axis=stack_axis), output_dir))
  with open(os.path.join(output_dir, 'atari_summary.json'), 'w') as f:
    json.dump(atari_report.summary(results), f, indent=2)
  return results


def default_curve_sizes(steps: int) -> Sequence[int]:
  """The size curve when none is asked for: a quarter, half and all steps."""
  return sorted({max(1, steps // 4), steps // 2, steps})
