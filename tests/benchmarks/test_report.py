"""Tests for smart_replay_benchmarks.report and .extras, on made-up results."""

import sys

import pytest

from smart_replay_benchmarks import extras
from smart_replay_benchmarks import report

pytestmark = pytest.mark.unit


def _results():
  """Results shaped as `benchmark_lib.run` returns them, with round numbers."""
  return {
      'workload': {'steps': 1000, 'num_envs': 8, 'observation_size': 32,
                   'observation': 'smooth', 'batch_size': 256},
      'machine': {'cpus': 2},
      'raw_bytes_per_step': 160,
      'insert_steps_per_s': {'stock': [90, 100, 110], 'ours': [500, 600, 700],
                             'ours_columns': [300] * 3, 'blocks': [800] * 3,
                             'ours_batched': [1200] * 3,
                             'reverb_floor': [1000] * 3,
                             'ours_no_journal': [600] * 3,
                             'ours_journal': [540] * 3,
                             'ours_journal_always': [300] * 3,
                             'ours_resend': [580] * 3},
      'journal': {'bytes_per_step': 60.0, 'replay_steps_per_s': 20_000.0,
                  'replay_s_per_100k_steps': 5.0},
      'sample_transitions_per_s': {
          'stock': [10] * 3, 'ours': [90] * 3, 'ours_columns': [30] * 3,
          'reverb_floor': [100] * 3, 'blocks_w1': [20] * 3,
          'blocks_w8': [50] * 3},
      'checkpoint': {
          'stock': {'seconds': 2.0, 'restore_seconds': 2.0, 'bytes': 4e6},
          'ours': {'seconds': 0.5, 'restore_seconds': 0.5, 'bytes': 1e6},
          'blocks': {'seconds': 0.5, 'restore_seconds': 0.5, 'bytes': 0.8e6}},
      'memory': {'stock': {'per_million_steps': 4000e6},
                 'ours': {'per_million_steps': 800e6},
                 'ours_columns': {'per_million_steps': 1600e6},
                 'blocks': {'per_million_steps': 320e6},
                 'raw_per_million_steps': 160e6},
      'curve': {'sizes': [1000, 3000],
                'sample': {'stock': [10, 9], 'ours': [80, 70],
                           'blocks': [20, 19]},
                'bytes_per_step': {'stock': [4000, 4100], 'ours': [900, 800],
                                   'blocks': [300, 250]},
                'skipped': [{'size': 10_000, 'reason': 'no room'}]},
  }


def test_ratios_are_ours_over_stock_of_the_medians_against_the_targets():
  ratios = report.ratios(_results())
  assert set(ratios) == set(report.TARGETS)
  values = {name: ratio['value'] for name, ratio in ratios.items()}
  assert values == pytest.approx({
      'insert': 6.0, 'batched_insert': 2.0, 'sample': 9.0,
      'checkpoint_restore_time': 0.25, 'checkpoint_bytes': 0.25,
      'memory': 5.0, 'memory_blocks': 2.0, 'journal_insert': 0.9})
  assert [name for name, r in ratios.items() if not r['met']] == [
      'memory_blocks']
  assert ratios['memory']['better'] == 'lower'
  assert ratios['memory']['target'] == report.TARGETS['memory'][0]


def test_the_table_has_a_row_per_measure_and_every_target():
  results = _results()
  results['ratios'] = report.ratios(results)
  lines = report.format_table(results).splitlines()
  insert = next(line for line in lines
                if line.startswith('insert steps/s (1 env, packed)'))
  assert insert.split()[-4:] == ['100', '600', '1,000', '6.00x']
  assert any(line.startswith('insert steps/s (8 envs)') for line in lines)
  assert any(line.startswith('sample (packed items, 8 windows/block)') and
             line.rstrip().endswith('5.00x') for line in lines)
  assert any('checkpoint MB (packed)' in line and '4.00' in line and
             '1.00' in line for line in lines)
  targets = lines[lines.index('targets:') + 1:lines.index('other ratios:')]
  assert [line.split()[0] for line in targets] == list(report.TARGETS)
  unmet = [line.split()[0] for line in targets if 'NOT met' in line]
  assert unmet == ['memory_blocks']
  assert any(line.startswith("insert steps/s (journal, 'every_second')") and
             line.rstrip().endswith('0.90x of no journal') for line in lines)
  assert any(line.startswith('insert steps/s (kept in memory to send') and
             line.rstrip().endswith('0.97x of no journal') for line in lines)
  assert any(line.split()[:2] == ['sample_blocks_w8', '5.00']
             for line in lines)
  assert any('3,000 steps: stock 9/s 4,100 B' in line for line in lines)
  assert any('10,000 steps: skipped: no room' in line for line in lines)


def test_the_charts_are_pngs(tmp_path):
  results = _results()
  results['ratios'] = report.ratios(results)
  report.plot(results, str(tmp_path / 'chart.png'))
  report.plot_curve(results, str(tmp_path / 'curve.png'))
  for name in ('chart.png', 'curve.png'):
    png = (tmp_path / name).read_bytes()
    assert png.startswith(b'\x89PNG\r\n\x1a\n') and len(png) > 10_000


def test_a_missing_extra_says_how_to_install_it(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, 'matplotlib', None)
  monkeypatch.setitem(sys.modules, 'psutil', None)
  results = _results()
  results['ratios'] = report.ratios(results)
  hint = r"matplotlib is needed .* pip install 'smart_replay\[bench\]'"
  with pytest.raises(ImportError, match=hint):
    report.plot(results, str(tmp_path / 'chart.png'))
  with pytest.raises(ImportError, match=r"psutil is needed .*make install"):
    extras.require('psutil')
  with pytest.raises(ImportError, match=r"psutil is needed .*\[bench\]"):
    extras.check_installed('psutil')
  assert not (tmp_path / 'chart.png').exists()
