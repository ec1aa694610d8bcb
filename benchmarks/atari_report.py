"""The Atari benchmark's report: ratios against stock, tables and a chart."""

from typing import Any, Dict, List, Optional

from smart_replay_benchmarks import atari_sides
from smart_replay_benchmarks import report

# measure: (what it compares, 'higher' or 'lower' is better).
MEASURES = {
    'memory': ('server RSS per step (slope over the second half)', 'lower'),
    'insert': ('observer steps/s', 'higher'),
    'sample': ('sampled windows/s (batch 32, num_steps 2)', 'higher'),
    'checkpoint_bytes': ('checkpoint bytes', 'lower'),
    'checkpoint_restore_time': ('checkpoint + restore seconds', 'lower'),
}
# side: {measure: target ratio, ours / stock}; a side not here is reference.
TARGETS = {
    'ours': {'memory': 1 / 8, 'insert': 2.0, 'sample': 2.5,
             'checkpoint_bytes': 0.1, 'checkpoint_restore_time': 0.1},
    'ours_blocks': {'memory': 1 / 50, 'insert': 2.0, 'sample': 2.0,
                    'checkpoint_bytes': 0.1, 'checkpoint_restore_time': 0.1},
}
_SHORT = {'memory': 'memory / step', 'insert': 'insert steps/s',
          'sample': 'sample windows/s', 'checkpoint_bytes': 'checkpoint bytes',
          'checkpoint_restore_time': 'checkpoint +\nrestore time'}


def _value(side: Dict[str, Any], measure: str) -> float:
  """A side's raw value of `measure`."""
  return {
      'memory': lambda: side['memory']['slope_bytes_per_step'],
      'insert': lambda: side['insert_steps_per_s'],
      'sample': lambda: side['sample_windows_per_s'],
      'checkpoint_bytes': lambda: side['checkpoint_bytes'],
      'checkpoint_restore_time': lambda: (side['checkpoint_seconds'] +
                                          side['restore_seconds']),
  }[measure]()


def ratios(results: Dict[str, Any]) -> Dict[str, Dict[str, Dict[str, Any]]]:
  """Every side's ratios against stock, with their targets.

  Args:
    results: what `atari_lib.run` measured (`sides` holds 'stock').

  Returns:
    `{side: {measure: {value, target, better, met, meaning}}}` for every
    side but stock; `target` and `met` are None for a reference side.
  """
  stock = results['sides']['stock']
  out = {}
  for name, side in results['sides'].items():
    if name == 'stock':
      continue
    out[name] = {}
    for measure, (meaning, better) in MEASURES.items():
      base = _value(stock, measure)
      value = _value(side, measure) / base if base else float('nan')
      target = TARGETS.get(name, {}).get(measure)
      met = None if target is None else bool(
          value >= target if better == 'higher' else value <= target)
      out[name][measure] = {'value': value, 'target': target,
                            'better': better, 'met': met,
                            'meaning': f'{meaning}, {name} / stock'}
  return out


def _fraction(value: float) -> str:
  """'1/21', or '1/5.6' below 10 (a rounded '1/6' would hide a miss)."""
  inverse = 1 / value
  return f'1/{inverse:.1f}' if inverse < 10 else f'1/{inverse:.0f}'


def _ratio(value: float) -> str:
  """'2.31x', or '0.048x (1/21)' below a half."""
  if value != value:  # NaN: stock measured nothing.
    return 'n/a'
  if 0 < value < 0.5:
    return f'{value:.3g}x ({_fraction(value)})'
  return f'{value:.2f}x'


def _target(target: Optional[float], better: str) -> str:
  if target is None:
    return ''
  if better == 'lower':
    return f'<= 1/{1 / target:.0f}'
  return f'>= {target:g}x'


def _markdown(rows: List[List[str]]) -> List[str]:
  """A markdown table of `rows`, the first the header, columns aligned."""
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = ['| ' + ' | '.join(c.ljust(w) for c, w in zip(row, widths)) + ' |'
           for row in rows]
  lines.insert(1, '|' + '|'.join('-' * (w + 2) for w in widths) + '|')
  return lines


def format_table(results: Dict[str, Any]) -> str:
  """The run's measurements and ratios as two markdown tables.

  Args:
    results: what `atari_lib.run` returned.

  Returns:
    The measurements per side, then each side's ratios against stock with
    the targets (met or not), then the stream and the size curve.
  """
  sides = results['sides']
  names = list(sides)
  header = ['measure'] + [atari_sides.LABELS[n] for n in names]
  rows = [header]
  raw = results['stream']['raw_bytes_per_step']
  for label, get in (
      ('server memory, B/step (RSS slope, 2nd half)',
       lambda s: f"{s['memory']['slope_bytes_per_step']:,.0f}"),
      ('RSS growth, B/step (whole write)',
       lambda s: f"{s['memory']['growth_bytes_per_step']:,.0f}"),
      ('projected memory for 1M steps (slope)',
       lambda s: f"{s['memory']['projected_1m_steps_bytes'] / 1e9:,.2f} GB"),
      ('insert steps/s', lambda s: f"{s['insert_steps_per_s']:,.0f}"),
      ('sample windows/s (batch 32, 2 steps)',
       lambda s: f"{s['sample_windows_per_s']:,.0f}"),
      ('checkpoint size', lambda s: f"{s['checkpoint_bytes'] / 1e6:,.2f} MB"),
      ('checkpoint s', lambda s: f"{s['checkpoint_seconds']:,.2f}"),
      ('restore s', lambda s: f"{s['restore_seconds']:,.2f}"),
      ('items (restored)',
       lambda s: f"{s['items']:,} ({s['restored_items']:,})")):
    rows.append([label] + [get(sides[n]) for n in names])
  lines = _markdown(rows)
  lines += ['', f'Ratios vs stock ({results["workload"]["steps"]:,} steps; '
            'targets as met / NOT met; no target: reference):', '']
  table = results['ratios']
  ours = [n for n in names if n != 'stock']
  rows = [['ratio vs stock'] + [atari_sides.LABELS[n] for n in ours]]
  for measure, (meaning, _) in MEASURES.items():
    cells = []
    for name in ours:
      ratio = table[name][measure]
      cell = _ratio(ratio['value'])
      if ratio['target'] is not None:
        verdict = 'met' if ratio['met'] else 'NOT met'
        cell += f", {verdict} ({_target(ratio['target'], ratio['better'])})"
      cells.append(cell)
    rows.append([meaning] + cells)
  lines += _markdown(rows)
  stream = results['stream']
  lines += ['', f"Stream: ALE {stream['game']} {stream['observation']}, "
            f"{results['workload']['steps']:,} steps, "
            f"{stream['episodes_ended']} episodes ended; raw {raw:,} B/step; "
            f"{results['machine']['cpus']} CPUs.",
            'Size curve (RSS growth / steps written, B/step):']
  for name in names:
    curve = sides[name]['memory']['curve']
    lines.append(f'  {name:16s} ' + ', '.join(
        f'{size:,}: {value:,.0f}'
        for size, value in zip(curve['sizes'], curve['bytes_per_step'])))
  lines.append('Marginal B/step between those sizes (RSS difference / steps) '
               'and the slope projected to 1M and 10M steps:')
  for name in names:
    memory = sides[name]['memory']
    curve = memory['curve']
    sizes = curve['sizes']
    marginal = curve['marginal_bytes_per_step']
    lines.append(f'  {name:16s} ' + ', '.join(
        f'{a:,}-{b:,}: {value:,.0f}'
        for a, b, value in zip(sizes, sizes[1:], marginal)) +
                 f"; 1M: {memory['projected_1m_steps_bytes'] / 1e9:.2f} GB, "
                 f"10M: {memory['projected_10m_steps_bytes'] / 1e9:.1f}"
                 ' GB')
  return '\n'.join(lines)


def plot(results: Dict[str, Any], path: str) -> None:
  """Draws each side's ratios against stock and the targets as a PNG.

  Bars are grouped by measure, one per side of ours: green where the
  target is met, red where not, grey for a reference side; a dashed line
  marks each bar's target.

  Args:
    results: what `atari_lib.run` measured (with `ratios`).
    path: the PNG file to write.

  Raises:
    ImportError: if matplotlib (the `bench` extra) is not installed.
  """
  pyplot = report._pyplot()  # pylint: disable=protected-access
  table = results['ratios']
  ours = list(table)
  width = 0.8 / len(ours)
  hatches = ['', '//', '..', 'xx', '\\\\', '++']
  figure, axes = pyplot.subplots(figsize=(11, 5.4))
  for index, name in enumerate(ours):
    for group, measure in enumerate(MEASURES):
      ratio = table[name][measure]
      x = group - 0.4 + width * (index + 0.5)
      color = ('tab:grey' if ratio['met'] is None else
               'tab:green' if ratio['met'] else 'tab:red')
      axes.bar(x, ratio['value'], width * 0.92, color=color,
               hatch=hatches[index % len(hatches)], edgecolor='white',
               label=atari_sides.LABELS[name] if group == 0 else None)
      if ratio['target'] is not None:
        axes.hlines(ratio['target'], x - width / 2, x + width / 2,
                    colors='black', linestyles='dashed', linewidth=1.2)
      text = (f"{ratio['value']:.2f}" if ratio['value'] >= 0.5 else
              _fraction(ratio['value']) if ratio['value'] > 0 else '0')
      top = ratio['value']  # Above a dashed target line just over the bar.
      if ratio['target'] is not None and top <= ratio['target'] < 1.4 * top:
        top = ratio['target']
      axes.annotate(text, (x, top), ha='center', va='bottom',
                    fontsize='small', textcoords='offset points',
                    xytext=(0, 2))
  axes.set_yscale('log')  # Ratios above and below 1 read alike.
  axes.axhline(1.0, color='grey', linewidth=0.8)
  axes.set_xticks(range(len(MEASURES)))
  axes.set_xticklabels(
      [f"{_SHORT[m]}\n({MEASURES[m][1]} is better)" for m in MEASURES])
  axes.set_ylabel('ours / stock, log scale\n(dashed: target; green: met, '
                  'red: not met, grey: reference)')
  axes.margins(y=0.15)
  legend = axes.legend(loc='upper left', fontsize='small', framealpha=0.9)
  for handle in legend.legend_handles:  # The hatch tells the side, not color.
    handle.set_facecolor('lightgrey')
    handle.set_edgecolor('black')
  workload = results['workload']
  axes.set_title(
      f"smart_replay vs stock TF-Agents on real {results['stream']['game']} "
      f"frames "
      f"({results['stream']['observation']}): {workload['steps']:,} steps, "
      f"{results['machine']['cpus']} CPUs")
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  pyplot.close(figure)


def summary(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Every run's ratios against stock, one entry per game and stack axis.

  Args:
    runs: what `atari_lib.run` returned, one per game and axis.

  Returns:
    `[{game, stack_axis, observation, steps, ratios: {side: {measure:
    value}}, met: {side: {measure: met}}}]`, in the runs' order.
  """
  return [{'game': r['stream']['game'],
           'stack_axis': r['stream']['stack_axis'],
           'observation': r['stream']['observation'],
           'steps': r['workload']['steps'],
           'ratios': {side: {m: v['value'] for m, v in measures.items()}
                      for side, measures in r['ratios'].items()},
           'met': {side: {m: v['met'] for m, v in measures.items()}
                   for side, measures in r['ratios'].items()}}
          for r in runs]


_SUMMARY_MEASURES = ('insert', 'sample', 'memory')


def format_summary(runs: List[Dict[str, Any]]) -> str:
  """The runs side by side: a row per game and stack axis, for each of our
  sides its insert, sample and memory ratios against stock.

  Args:
    runs: what `atari_lib.run` returned, one per game and axis.

  Returns:
    A markdown table; a ratio that misses its target is marked '(NOT met)'.
  """
  entries = summary(runs)
  sides = list(entries[0]['ratios']) if entries else []
  header = ['game', 'observation'] + [
      f'{atari_sides.LABELS[s]}: insert / sample / memory' for s in sides]
  rows = [header]
  for entry in entries:
    cells = []
    for side in sides:
      parts = []
      for measure in _SUMMARY_MEASURES:
        value = entry['ratios'].get(side, {}).get(measure, float('nan'))
        part = _ratio(value).split(' (')[0]
        if entry['met'].get(side, {}).get(measure) is False:
          part += ' (NOT met)'
        parts.append(part)
      cells.append(' / '.join(parts))
    rows.append([entry['game'], entry['observation']] + cells)
  return '\n'.join(_markdown(rows))
