"""The benchmark's report: ratios against their targets, a table, charts."""

import statistics
from typing import Any, Dict, List

from smart_replay_benchmarks import extras

# name: (target, 'higher' or 'lower' is better, what it compares).
TARGETS = {
    'insert': (5.0, 'higher', 'observer steps/s, ours (packed) / stock'),
    'batched_insert': (1.5, 'higher',
                       'batched observer steps/s / our single-env steps/s'),
    'sample': (8.0, 'higher', 'transitions/s, get_dataset (packed, i.i.d. '
               'windows) / as_dataset'),
    'checkpoint_restore_time': (0.4, 'lower',
                                'checkpoint + restore seconds, ours / stock'),
    'checkpoint_bytes': (0.5, 'lower', 'checkpoint bytes, ours / stock'),
    'memory': (6.0, 'lower', 'server RSS growth / raw data bytes (ours, '
               'packed, one item per window)'),
    'memory_blocks': (1.5, 'lower', 'server RSS growth / raw data bytes '
                      '(packed items of 32 steps)'),
    'journal_insert': (0.85, 'higher', 'observer steps/s with the default '
                       "write-ahead journal ('every_second') / without"),
}
# Reported beside the targets, without one.
INFO = {
    'insert_columns': 'observer steps/s, ours with one column per field / '
                      'stock',
    'insert_blocks': 'observer steps/s, ours with packed items / stock',
    'sample_columns': 'transitions/s, get_dataset with one column per '
                      'field / as_dataset',
    'sample_blocks_w1': 'transitions/s, packed items, 1 window per block / '
                        'as_dataset',
    'sample_blocks_w8': 'transitions/s, packed items, 8 windows per block / '
                        'as_dataset',
    'checkpoint_bytes_blocks': 'checkpoint bytes, packed items / stock',
    'journal_insert_always': "observer steps/s with a journal synced at "
                             "every flush ('always') / without",
    'resend_insert': 'observer steps/s keeping what it sent in memory (a '
                     'client observer, to send it again after a server '
                     'restart) / without',
}


def _median(values: List[float]) -> float:
  return float(statistics.median(values))


def _values(results: Dict[str, Any]) -> Dict[str, float]:
  """Every ratio of a run, targets and information alike."""
  inserts = {k: _median(v) for k, v in results['insert_steps_per_s'].items()}
  samples = {k: _median(v)
             for k, v in results['sample_transitions_per_s'].items()}
  ckpt = results['checkpoint']
  time_s = {k: ckpt[k]['seconds'] + ckpt[k]['restore_seconds'] for k in ckpt}
  memory = results['memory']
  raw = memory['raw_per_million_steps']
  return {
      'insert': inserts['ours'] / inserts['stock'],
      'batched_insert': inserts['ours_batched'] / inserts['ours'],
      'sample': samples['ours'] / samples['stock'],
      'checkpoint_restore_time': time_s['ours'] / time_s['stock'],
      'checkpoint_bytes': ckpt['ours']['bytes'] / ckpt['stock']['bytes'],
      'memory': memory['ours']['per_million_steps'] / raw,
      'memory_blocks': memory['blocks']['per_million_steps'] / raw,
      'insert_columns': inserts['ours_columns'] / inserts['stock'],
      'insert_blocks': inserts['blocks'] / inserts['stock'],
      'sample_columns': samples['ours_columns'] / samples['stock'],
      'sample_blocks_w1': samples['blocks_w1'] / samples['stock'],
      'sample_blocks_w8': samples['blocks_w8'] / samples['stock'],
      'checkpoint_bytes_blocks': (ckpt['blocks']['bytes'] /
                                  ckpt['stock']['bytes']),
      'journal_insert': inserts['ours_journal'] / inserts['ours_no_journal'],
      'journal_insert_always': (inserts['ours_journal_always'] /
                                inserts['ours_no_journal']),
      'resend_insert': inserts['ours_resend'] / inserts['ours_no_journal'],
  }


def ratios(results: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
  """The target ratios of a run's results.

  Args:
    results: what `run` measured.

  Returns:
    {name: {value, target, better, met, meaning}} for every `TARGETS` entry.
  """
  values = _values(results)
  out = {}
  for name, (target, better, meaning) in TARGETS.items():
    value = values[name]
    met = value >= target if better == 'higher' else value <= target
    out[name] = {'value': value, 'target': target, 'better': better,
                 'met': bool(met), 'meaning': meaning}
  return out


def format_table(results: Dict[str, Any]) -> str:
  """The run's medians and ratios as a plain-text table.

  Args:
    results: what `run` returned.

  Returns:
    The table, the targets (met or not) and the other ratios, one line each.
  """
  rows = [('measure', 'stock', 'ours', 'reverb floor', 'ratio')]
  inserts = {k: _median(v) for k, v in results['insert_steps_per_s'].items()}
  stock = inserts['stock']
  for name, label in (('ours', 'insert steps/s (1 env, packed)'),
                      ('ours_columns', 'insert steps/s (1 env, columns)'),
                      ('blocks', 'insert steps/s (1 env, packed items)')):
    floor = f"{inserts['reverb_floor']:,.0f}" if name == 'ours' else ''
    rows.append((label, f'{stock:,.0f}', f'{inserts[name]:,.0f}', floor,
                 f'{inserts[name] / stock:.2f}x'))
  rows.append((f"insert steps/s ({results['workload']['num_envs']} envs)", '',
               f"{inserts['ours_batched']:,.0f}", '',
               f"{inserts['ours_batched'] / inserts['ours']:.2f}x of 1 env"))
  for name, label in (
      ('ours_journal', "insert steps/s (journal, 'every_second')"),
      ('ours_journal_always', "insert steps/s (journal, 'always')"),
      ('ours_resend', 'insert steps/s (kept in memory to send again)')):
    rows.append((label, '', f'{inserts[name]:,.0f}', '',
                 f"{inserts[name] / inserts['ours_no_journal']:.2f}x of no "
                 'journal'))
  journal = results['journal']
  rows.append(('journal bytes on disk / step', '',
               f"{journal['bytes_per_step']:,.0f}", '', ''))
  rows.append(('journal replay s / 100k steps', '',
               f"{journal['replay_s_per_100k_steps']:,.1f}", '',
               f"{journal['replay_steps_per_s']:,.0f} steps/s"))
  samples = {k: _median(v)
             for k, v in results['sample_transitions_per_s'].items()}
  for name, label in (('ours', 'sample transitions/s (packed)'),
                      ('ours_columns', 'sample transitions/s (columns)'),
                      ('blocks_w1', 'sample (packed items, 1 window/block)'),
                      ('blocks_w8', 'sample (packed items, 8 windows/block)')):
    floor = f"{samples['reverb_floor']:,.0f}" if name == 'ours' else ''
    rows.append((label, f"{samples['stock']:,.0f}", f'{samples[name]:,.0f}',
                 floor, f"{samples[name] / samples['stock']:.2f}x"))
  ckpt = results['checkpoint']
  for key, label, scale in (('seconds', 'checkpoint s', 1),
                            ('restore_seconds', 'restore s', 1),
                            ('bytes', 'checkpoint MB', 1e-6)):
    for name in ('ours', 'blocks'):
      rows.append((f'{label} ({"packed" if name == "ours" else "items"})',
                   f"{ckpt['stock'][key] * scale:,.2f}",
                   f'{ckpt[name][key] * scale:,.2f}', '',
                   f"{ckpt[name][key] / ckpt['stock'][key]:.2f}x"))
  memory = results['memory']
  raw = memory['raw_per_million_steps']
  for name in ('ours', 'ours_columns', 'blocks'):
    rows.append((f'server RSS MB / 1M steps ({name})',
                 f"{memory['stock']['per_million_steps'] / 1e6:,.0f}",
                 f"{memory[name]['per_million_steps'] / 1e6:,.0f}",
                 f'raw {raw / 1e6:,.0f}',
                 f"{memory[name]['per_million_steps'] / raw:.2f}x raw"))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = ['  '.join(cell.ljust(width) for cell, width in zip(row, widths))
           for row in rows]
  lines += ['', 'targets:']
  for name, ratio in results['ratios'].items():
    sign = '>=' if ratio['better'] == 'higher' else '<='
    lines.append(f"  {name:24s} {ratio['value']:6.2f}  target {sign} "
                 f"{ratio['target']:g}  {'met' if ratio['met'] else 'NOT met'}"
                 f"  ({ratio['meaning']})")
  values = _values(results)
  lines.append('other ratios:')
  lines += [f'  {name:24s} {values[name]:6.2f}  ({meaning})'
            for name, meaning in INFO.items()]
  curve = results.get('curve') or {}
  if curve.get('sizes'):
    lines.append('size curve (transitions/s; server bytes per step):')
    for index, size in enumerate(curve['sizes']):
      lines.append(f'  {size:>10,} steps: ' + ', '.join(
          f"{name} {curve['sample'][name][index]:,.0f}/s "
          f"{curve['bytes_per_step'][name][index]:,.0f} B"
          for name in curve['sample']))
  for skipped in (curve.get('skipped') or []):
    lines.append(f"  {skipped['size']:>10,} steps: skipped: "
                 f"{skipped['reason']}")
  return '\n'.join(lines)


def _pyplot():
  """matplotlib's pyplot on the Agg backend (the `bench` extra)."""
  matplotlib = extras.require('matplotlib')
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  return pyplot


def plot(results: Dict[str, Any], path: str) -> None:
  """Draws the ratios against their targets as a PNG bar chart.

  Args:
    results: what `run` measured (with `ratios`).
    path: the PNG file to write.

  Raises:
    ImportError: if matplotlib (the `bench` extra) is not installed.
  """
  pyplot = _pyplot()
  names = list(results['ratios'])
  values = [results['ratios'][n]['value'] for n in names]
  colors = ['tab:green' if results['ratios'][n]['met'] else 'tab:red'
            for n in names]
  figure, axes = pyplot.subplots(figsize=(10, 4.8))
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
      f"observation {_observation(workload)}, "
      f"{results['machine']['cpus']} CPUs")
  figure.tight_layout()
  figure.savefig(path)
  pyplot.close(figure)


def _observation(workload: Dict[str, Any]) -> str:
  """The workload's observation, e.g. 'float32[32] (smooth)'."""
  shape = list(workload.get('observation_shape') or
               [workload['observation_size']])
  return (f"{workload.get('observation_dtype', 'float32')}{shape} "
          f"({workload['observation']})")


def _steps(count: int) -> str:
  """A step count for an axis: '100k', '1M', '2.5M'."""
  if count >= 1_000_000:
    return f'{count / 1e6:g}M'
  return f'{count / 1e3:g}k' if count >= 1000 else str(count)


def plot_curve(results: Dict[str, Any], path: str) -> None:
  """Draws sampling speed and memory per step against buffer size.

  Args:
    results: what `run` measured, with a non-empty `curve`.
    path: the PNG file to write.

  Raises:
    ImportError: if matplotlib (the `bench` extra) is not installed.
  """
  pyplot = _pyplot()
  curve = results['curve']
  labels = {'stock': 'stock TF-Agents', 'ours': 'smart_replay, packed',
            'blocks': 'smart_replay, packed items (32 steps)'}
  figure, (speed, memory) = pyplot.subplots(1, 2, figsize=(11, 4.5))
  for index, name in enumerate(curve['sample']):
    below = index == len(curve['sample']) - 1  # Labels of the last: below.
    for axes, values, unit in ((speed, curve['sample'][name], '/s'),
                               (memory, curve['bytes_per_step'][name], ' B')):
      axes.plot(curve['sizes'], values, marker='o',
                label=labels.get(name, name))
      for size, value in zip(curve['sizes'], values):
        axes.annotate(f'{value:,.0f}{unit}', (size, value), fontsize='small',
                      textcoords='offset points',
                      xytext=(0, -13 if below else 6), ha='center')
  raw = results['raw_bytes_per_step']
  memory.axhline(raw, color='grey', linestyle='dashed',
                 label=f'raw data ({raw} B/step)')
  for axes, ylabel in ((speed, 'sampled transitions/s (batch '
                        f"{results['workload']['batch_size']})"),
                       (memory, 'server RSS growth, bytes per step')):
    axes.set_xscale('log')
    axes.set_yscale('log')
    axes.set_xticks(curve['sizes'])
    axes.set_xticklabels([_steps(size) for size in curve['sizes']])
    axes.xaxis.set_minor_locator(pyplot.NullLocator())
    axes.margins(x=0.12, y=0.12)
    axes.set_xlabel('buffer size, steps (log scale)')
    axes.set_ylabel(f'{ylabel} (log scale)')
    axes.grid(True, which='both', alpha=0.3)
  speed.set_title('Sampling speed against buffer size')
  memory.set_title('Server memory per step against buffer size')
  figure.suptitle(f"observation {_observation(results['workload'])}, "
                  f"{results['machine']['cpus']} CPUs")
  # One legend for both panels, below them, so it hides no line.
  handles, names = memory.get_legend_handles_labels()
  figure.legend(handles, names, loc='lower center', ncol=len(names),
                fontsize='small')
  figure.tight_layout(rect=(0, 0.07, 1, 1))
  figure.savefig(path)
  pyplot.close(figure)
