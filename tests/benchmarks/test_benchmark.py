"""Tests for smart_replay_benchmarks.benchmark_lib: one tiny real run.

Speed targets are never asserted here (shared, noisy machines); the tiny run
only checks that every measurement is made and reported.
"""

import json

from smart_replay_benchmarks import benchmark_lib as benchmark


def test_a_tiny_run_measures_and_reports_everything(tmp_path):
  workload = benchmark.Workload(
      steps=400, repeats=2, observation_size=4, episode_length=10,
      num_envs=2, batch_size=8, sample_batches=3)
  results = benchmark.run(workload, str(tmp_path), curve_sizes=(200, 400))
  assert set(results['ratios']) == set(benchmark.TARGETS)
  for name in ('insert', 'batched_insert', 'sample', 'checkpoint_bytes',
               'checkpoint_restore_time', 'journal_insert'):
    assert results['ratios'][name]['value'] > 0, name
  # Memory: a 400-step run may not grow the RSS at all; it is only reported.
  assert isinstance(results['ratios']['memory']['value'], float)
  assert set(results['insert_steps_per_s']) == {
      'stock', 'ours', 'ours_columns', 'blocks', 'ours_batched',
      'reverb_floor', 'ours_no_journal', 'ours_journal',
      'ours_journal_always', 'ours_resend'}
  journal = results['journal']  # One repeat's 200 steps, replayed.
  assert journal['bytes_per_step'] > 0 and journal['replay_steps_per_s'] > 0
  for rates in results['insert_steps_per_s'].values():
    assert len(rates) == 2 and min(rates) > 0
  rates = results['sample_transitions_per_s']
  assert set(rates) == {'stock', 'ours', 'ours_columns', 'reverb_floor',
                        'blocks_w1', 'blocks_w8'}
  assert all(len(r) == 3 and min(r) > 0 for r in rates.values())
  # The per-window buffers hold the same items, and restored all of them;
  # the block buffer holds the same 360 windows in blocks of up to 31.
  checkpoint = results['checkpoint']
  assert checkpoint['ours']['items'] == checkpoint['stock']['items'] == 360
  assert checkpoint['ours']['restored_items'] == 360
  assert checkpoint['stock']['restored_items'] == 360
  assert 12 <= checkpoint['blocks']['items'] < 360
  assert (checkpoint['blocks']['restored_items'] ==
          checkpoint['blocks']['items'])
  curve = results['curve']
  assert curve['sizes'] == [200, 400] and not curve['skipped']
  assert all(min(v) > 0 for v in curve['sample'].values())
  assert json.loads((tmp_path / 'benchmark.json').read_text())['ratios']
  for name in ('benchmark.png', 'curve.png'):
    png = (tmp_path / name).read_bytes()
    assert png.startswith(b'\x89PNG\r\n\x1a\n') and len(png) > 10_000
  table = benchmark.format_table(results)
  assert 'insert steps/s (1 env, packed)' in table and 'targets:' in table
  assert not (tmp_path / 'servers').exists()  # Checkpoints are cleaned up.
