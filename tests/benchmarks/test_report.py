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
                   'observation': 'smooth'},
      'machine': {'cpus': 2},
      'insert_steps_per_s': {'stock': [90, 100, 110], 'ours': [500, 600, 700],
                             'ours_batched': [1200] * 3,
                             'reverb_floor': [1000] * 3},
      'sample_transitions_per_s': {
          'ours_buffer': {'stock': [10] * 3, 'ours': [70] * 3,
                          'reverb_floor': [80] * 3},
          'stock_buffer': {'stock': [20] * 3, 'ours': [60] * 3,
                           'reverb_floor': [90] * 3}},
      'checkpoint': {
          'stock': {'seconds': 2.0, 'restore_seconds': 2.0, 'bytes': 4e6},
          'ours': {'seconds': 0.5, 'restore_seconds': 0.5, 'bytes': 1e6}},
      'memory': {'stock': {'per_million_steps': 400e6},
                 'ours': {'per_million_steps': 300e6},
                 'raw_per_million_steps': 160e6},
  }


def test_ratios_are_ours_over_stock_of_the_medians_against_the_targets():
  ratios = report.ratios(_results())
  assert set(ratios) == set(report.TARGETS)
  values = {name: ratio['value'] for name, ratio in ratios.items()}
  assert values == pytest.approx({
      'insert': 6.0, 'batched_insert': 2.0, 'sample': 7.0,
      'checkpoint_restore_time': 0.25, 'checkpoint_bytes': 0.25,
      'memory': 300 / 160})
  assert [name for name, r in ratios.items() if not r['met']] == ['memory']
  assert ratios['memory']['better'] == 'lower'
  assert ratios['memory']['target'] == report.TARGETS['memory'][0]


def test_the_table_has_a_row_per_measure_and_every_target():
  results = _results()
  results['ratios'] = report.ratios(results)
  lines = report.format_table(results).splitlines()
  insert = next(line for line in lines if line.startswith('insert steps/s (1'))
  assert insert.split() == ['insert', 'steps/s', '(1', 'env)', '100', '600',
                            '1,000', '6.00x']
  assert any(line.startswith('insert steps/s (8 envs)') for line in lines)
  assert any(line.startswith('sample transitions/s (stock buffer)')
             for line in lines)
  assert any('checkpoint MB' in line and '4.00' in line and '1.00' in line
             for line in lines)
  targets = lines[lines.index('targets:') + 1:]
  assert len(targets) == len(report.TARGETS)
  assert [line.split()[0] for line in targets] == list(report.TARGETS)
  assert 'NOT met' in targets[-1] and 'NOT met' not in ' '.join(targets[:-1])


def test_the_chart_is_a_png(tmp_path):
  results = _results()
  results['ratios'] = report.ratios(results)
  report.plot(results, str(tmp_path / 'chart.png'))
  png = (tmp_path / 'chart.png').read_bytes()
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
