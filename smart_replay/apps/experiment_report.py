"""Learning curves, a figure and a table from the mixing experiment's runs.

Each run's greedy return is read back from its `<run_dir>/eval` TensorBoard
file (TF-Agents' `Metrics/AverageReturn`, written by `train_from_starter`'s
evaluations). A `Report` holds the curves of every variant and seed; `write`
stores it as `report.json`, draws `<setup>.png` (mean over seeds, shaded
between the lowest and highest seed, the starter's policy as a dashed
reference line) and writes `table.md` (mean ± std over seeds at fixed train
steps).
"""

import dataclasses
import glob
import json
import os
from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf

from smart_replay.tools import plots

RETURN_TAG = 'Metrics/AverageReturn'


@dataclasses.dataclass
class Report:
  """The experiment's results for one environment.

  Attributes:
    setup: the setup's name ('cartpole' or 'thermal').
    env: the environment.
    policy: the starter's policy.
    baseline_return: that policy's mean return per episode.
    num_train_steps: train steps per run.
    eval_interval: train steps between evaluations.
    seeds: the seeds.
    curves: variant -> one `{train step: greedy return}` per seed.
  """
  setup: str
  env: str
  policy: str
  baseline_return: float
  num_train_steps: int
  eval_interval: int
  seeds: List[int]
  curves: Dict[str, List[Dict[int, float]]]

  def at(self, variant: str, step: int) -> List[float]:
    """The seeds' greedy returns of `variant` at `step` (where evaluated)."""
    return [curve[step] for curve in self.curves[variant] if step in curve]


def read_eval_curve(run_dir: str) -> Dict[int, float]:
  """`{train step: greedy return}` from a run's `eval/` event files.

  Args:
    run_dir: a `train_from_starter` run directory.

  Returns:
    The evaluations, by train step (a later write of a step wins, as in
    TensorBoard after a resume).
  """
  curve = {}
  for path in sorted(glob.glob(os.path.join(run_dir, 'eval', 'events.*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == RETURN_TAG:
          curve[int(event.step)] = float(tf.make_ndarray(value.tensor))
  return dict(sorted(curve.items()))


def table_steps(num_train_steps: int, eval_interval: int) -> List[int]:
  """The train steps the table reports: the evaluations nearest a fifth and
  half of the run (rounded down), and the last step."""
  marks = {int(num_train_steps * k) // eval_interval * eval_interval
           for k in (0.2, 0.5)}
  return sorted({m for m in marks if m > 0} | {num_train_steps})


def markdown_table(report: Report, steps: Sequence[int]) -> str:
  """The greedy return, mean ± std over seeds, as Markdown.

  Columns: the return at `steps`, each seed's mean over all its evaluations
  (how fast it learns: the area under its curve) and its best evaluation.

  Args:
    report: the experiment's report.
    steps: train steps (columns).

  Returns:
    A Markdown table, one row per variant, and the reference policy's row.
  """
  head = (['variant'] + [f'step {s:,}' for s in steps] +
          ['mean of all evaluations', 'best evaluation'])
  rows = ['| ' + ' | '.join(head) + ' |',
          '|' + '---|' * len(head)]
  spread = lambda values: (f'{np.mean(values):.1f} ± {np.std(values):.1f}'
                           if values else 'n/a')
  for variant, curves in report.curves.items():
    cells = [variant] + [spread(report.at(variant, step)) for step in steps]
    cells.append(spread([float(np.mean(list(c.values()))) for c in curves
                         if c]))
    cells.append(spread([max(c.values()) for c in curves if c]))
    rows.append('| ' + ' | '.join(cells) + ' |')
  rows.append(f'| {report.policy} policy (starter) | '
              + ' | '.join([f'{report.baseline_return:.1f}'] *
                           (len(head) - 1)) + ' |')
  return '\n'.join(rows)


def draw(report: Report, output_png: str) -> str:
  """Draws the learning curves of every variant into `output_png`.

  Args:
    report: the experiment's report.
    output_png: the figure's path.

  Returns:
    `output_png`.

  Raises:
    MissingExtraError: if matplotlib is not installed.
  """
  pyplot = plots.pyplot()
  figure, axis = pyplot.subplots(figsize=(10, 5))
  for variant, curves in report.curves.items():
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves \
        else []
    if not steps:
      continue
    values = np.array([[c[s] for s in steps] for c in curves])
    line, = axis.plot(steps, values.mean(axis=0), marker='o', markersize=3,
                      label=f'{variant} ({len(curves)} seeds)')
    axis.fill_between(steps, values.min(axis=0), values.max(axis=0),
                      color=line.get_color(), alpha=0.15)
  axis.axhline(report.baseline_return, color='black', linestyle='--',
               linewidth=1,
               label=f'{report.policy} policy: {report.baseline_return:.1f}')
  axis.set_xlabel('train steps')
  axis.set_ylabel('greedy return per episode')
  name = report.setup if report.env == report.setup else \
      f'{report.setup} ({report.env})'
  low, high = axis.get_ylim()  # Keep the reference line off the frame.
  pad = 0.05 * (high - low)
  axis.set_ylim(min(low, report.baseline_return - pad),
                max(high, report.baseline_return + pad))
  axis.set_title(f'{name}: greedy return\n'
                 f'line: mean of {len(report.seeds)} seeds; band: lowest to '
                 'highest seed', fontsize='medium')
  axis.grid(alpha=0.3)
  axis.legend(fontsize='small', loc='upper left', bbox_to_anchor=(1.01, 1.0))
  figure.tight_layout()
  figure.savefig(output_png, dpi=110)
  pyplot.close(figure)
  return output_png


def write(report: Report, root: str) -> Dict[str, str]:
  """Writes `report.json`, `<setup>.png` and `table.md` into `root`.

  Args:
    report: the experiment's report.
    root: the setup's experiment directory.

  Returns:
    `{'report', 'figure', 'table'}` paths.
  """
  paths = {'report': os.path.join(root, 'report.json'),
           'figure': os.path.join(root, f'{report.setup}.png'),
           'table': os.path.join(root, 'table.md')}
  with open(paths['report'], 'w') as f:
    json.dump(dataclasses.asdict(report), f, indent=2)
  draw(report, paths['figure'])
  with open(paths['table'], 'w') as f:
    f.write(markdown_table(report, table_steps(report.num_train_steps,
                                               report.eval_interval)) + '\n')
  return paths
