"""The benchmark's report: ratios against their targets, a table, a chart."""

import statistics
from typing import Any, Dict, List

from smart_replay_benchmarks import extras

# name: (target, 'higher' or 'lower' is better, what it compares).
TARGETS = {
    'insert': (5.0, 'higher', 'observer steps/s, ours / stock'),
    'batched_insert': (1.5, 'higher',
                       'batched observer steps/s / our single-env steps/s'),
    'sample': (6.0, 'higher', 'transitions/s, get_dataset / as_dataset'),
    'checkpoint_restore_time': (0.5, 'lower',
                                'checkpoint + restore seconds, ours / stock'),
    'checkpoint_bytes': (0.5, 'lower', 'checkpoint bytes, ours / stock'),
    'memory': (1.5, 'lower', 'server RSS growth / raw data bytes (ours)'),
}


def _median(values: List[float]) -> float:
  return float(statistics.median(values))


def ratios(results: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
  """The target ratios of a run's results.

  Args:
    results: what `run` measured.

  Returns:
    {name: {value, target, better, met, meaning}} for every `TARGETS` entry.
  """
  inserts = {k: _median(v) for k, v in results['insert_steps_per_s'].items()}
  samples = {k: _median(v) for k, v in
             results['sample_transitions_per_s']['ours_buffer'].items()}
  ckpt = results['checkpoint']
  time_s = {k: ckpt[k]['seconds'] + ckpt[k]['restore_seconds'] for k in ckpt}
  memory = results['memory']
  values = {
      'insert': inserts['ours'] / inserts['stock'],
      'batched_insert': inserts['ours_batched'] / inserts['ours'],
      'sample': samples['ours'] / samples['stock'],
      'checkpoint_restore_time': time_s['ours'] / time_s['stock'],
      'checkpoint_bytes': ckpt['ours']['bytes'] / ckpt['stock']['bytes'],
      'memory': (memory['ours']['per_million_steps'] /
                 memory['raw_per_million_steps']),
  }
  out = {}
  for name, value in values.items():
    target, better, meaning = TARGETS[name]
    met = value >= target if better == 'higher' else value <= target
    out[name] = {'value': value, 'target': target, 'better': better,
                 'met': bool(met), 'meaning': meaning}
  return out


def format_table(results: Dict[str, Any]) -> str:
  """The run's medians and ratios as a plain-text table.

  Args:
    results: what `run` returned.

  Returns:
    The table and the list of targets (met or not), one line each.
  """
  rows = [('measure', 'stock', 'ours', 'reverb floor', 'ratio')]
  inserts = {k: _median(v) for k, v in results['insert_steps_per_s'].items()}
  rows.append(('insert steps/s (1 env)', f"{inserts['stock']:,.0f}",
               f"{inserts['ours']:,.0f}", f"{inserts['reverb_floor']:,.0f}",
               f"{inserts['ours'] / inserts['stock']:.2f}x"))
  rows.append((f"insert steps/s ({results['workload']['num_envs']} envs)", '',
               f"{inserts['ours_batched']:,.0f}", '',
               f"{inserts['ours_batched'] / inserts['ours']:.2f}x of 1 env"))
  for buffer, rates in results['sample_transitions_per_s'].items():
    medians = {k: _median(v) for k, v in rates.items()}
    rows.append((f"sample transitions/s ({buffer.replace('_', ' ')})",
                 f"{medians['stock']:,.0f}", f"{medians['ours']:,.0f}",
                 f"{medians['reverb_floor']:,.0f}",
                 f"{medians['ours'] / medians['stock']:.2f}x"))
  ckpt = results['checkpoint']
  for key, label, scale in (('seconds', 'checkpoint s', 1),
                            ('restore_seconds', 'restore s', 1),
                            ('bytes', 'checkpoint MB', 1e-6)):
    rows.append((label, f"{ckpt['stock'][key] * scale:,.2f}",
                 f"{ckpt['ours'][key] * scale:,.2f}", '',
                 f"{ckpt['ours'][key] / ckpt['stock'][key]:.2f}x"))
  memory = results['memory']
  raw = memory['raw_per_million_steps']
  rows.append(('server RSS MB / 1M steps',
               f"{memory['stock']['per_million_steps'] / 1e6:,.0f}",
               f"{memory['ours']['per_million_steps'] / 1e6:,.0f}",
               f'raw {raw / 1e6:,.0f}',
               f"{memory['ours']['per_million_steps'] / raw:.2f}x raw"))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = ['  '.join(cell.ljust(width) for cell, width in zip(row, widths))
           for row in rows]
  lines.append('')
  lines.append('targets:')
  for name, ratio in results['ratios'].items():
    sign = '>=' if ratio['better'] == 'higher' else '<='
    lines.append(f"  {name:24s} {ratio['value']:6.2f}  target {sign} "
                 f"{ratio['target']:g}  {'met' if ratio['met'] else 'NOT met'}"
                 f"  ({ratio['meaning']})")
  return '\n'.join(lines)


def plot(results: Dict[str, Any], path: str) -> None:
  """Draws the ratios against their targets as a PNG bar chart.

  Args:
    results: what `run` measured (with `ratios`).
    path: the PNG file to write.

  Raises:
    ImportError: if matplotlib (the `bench` extra) is not installed.
  """
  matplotlib = extras.require('matplotlib')
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  names = list(results['ratios'])
  values = [results['ratios'][n]['value'] for n in names]
  colors = ['tab:green' if results['ratios'][n]['met'] else 'tab:red'
            for n in names]
  figure, axes = pyplot.subplots(figsize=(9, 4.5))
  axes.bar(range(len(names)), values, color=colors)
  for i, name in enumerate(names):
    ratio = results['ratios'][name]
    axes.hlines(ratio['target'], i - 0.4, i + 0.4, colors='black',
                linestyles='dashed')
    axes.annotate(f"{ratio['value']:.2f}", (i, ratio['value']),
                  ha='center', va='bottom')
  axes.set_yscale('log')  # Ratios above and below 1 read alike.
  axes.axhline(1.0, color='grey', linewidth=0.8)
  axes.set_xticks(range(len(names)))
  axes.set_xticklabels([n.replace('_', '\n') for n in names])
  axes.set_ylabel('ratio, log scale (dashed: target; green: met)')
  workload = results['workload']
  axes.set_title(
      f"smart_replay vs stock TF-Agents: {workload['steps']:,} steps, "
      f"observation float32[{workload['observation_size']}] "
      f"({workload['observation']}), {results['machine']['cpus']} CPUs")
  figure.tight_layout()
  figure.savefig(path)
  pyplot.close(figure)
