"""Tests for the Atari benchmark (atari_lib, atari_frames, atari_report).

One tiny real run checks that every side is measured and reported with sane
numbers; speed and memory targets are never asserted (shared, noisy
machines, and 600 steps say little about memory).
"""

import json

import numpy as np
import pytest

from smart_replay_benchmarks import atari_frames
from smart_replay_benchmarks import atari_lib
from smart_replay_benchmarks import atari_report


@pytest.mark.unit
@pytest.mark.parametrize('field, value, message', [
    ('steps', 3, r'steps must be an integer >= 4, got 3'),
    ('sides', ('ours', 'stock'), r'must start with stock'),
    ('sides', ('stock', 'mine'), r"got \['stock', 'mine'\]"),
    ('sides', ('stock',), r'at least one of ours'),
    ('curve_sizes', (10, 30_000), r'between 1 and steps=20000; got \[30000\]'),
    ('sample_seconds', 0.0, r'sample_seconds must be > 0'),
    ('stack_axis', 2, r'AtariWorkload.stack_axis must be 0 \(uint8\[4, 84, '
     r'84\], Gymnasium\) or -1 \(uint8\[84, 84, 4\], TF-Agents\), got 2'),
])
def test_bad_workload_is_refused_with_the_field(field, value, message):
  with pytest.raises(ValueError, match=message):
    atari_lib.AtariWorkload(**{field: value})


@pytest.mark.unit
def test_rss_is_read_at_the_curve_the_half_and_the_end():
  workload = atari_lib.AtariWorkload(steps=1000, curve_sizes=(250, 1000))
  assert workload.marks == (250, 500, 1000)
  assert atari_lib.default_curve_sizes(20_000) == [5000, 10_000, 20_000]


def _side(slope, insert, sample, ckpt_bytes, ckpt_s, restore_s):
  return {'memory': {'slope_bytes_per_step': slope,
                     'growth_bytes_per_step': slope * 1.5,
                     'projected_1m_steps_bytes': slope * 1e6,
                     'projected_10m_steps_bytes': slope * 1e7,
                     'curve': {'sizes': [50, 100],
                               'bytes_per_step': [slope * 2, slope],
                               'marginal_bytes_per_step': [slope * 5 / 6]}},
          'insert_steps_per_s': insert, 'sample_windows_per_s': sample,
          'checkpoint_bytes': ckpt_bytes, 'checkpoint_seconds': ckpt_s,
          'restore_seconds': restore_s, 'items': 99, 'restored_items': 99}


@pytest.mark.unit
def test_ratios_are_against_stock_with_each_sides_targets(tmp_path):
  results = {
      'workload': {'steps': 100}, 'machine': {'cpus': 2},
      'stream': {'game': 'Pong', 'observation': 'uint8[4, 84, 84]',
                 'episodes_ended': 0, 'raw_bytes_per_step': 28_248},
      'sides': {'stock': _side(6000, 3000, 10_000, 1000, 1.0, 1.0),
                'ours': _side(700, 9000, 30_000, 50, 0.1, 0.05),
                'ours_blocks': _side(300, 3000, 5000, 50, 0.1, 0.05),
                'ours_noframes': _side(5000, 6000, 20_000, 800, 1.0, 1.0)}}
  ratios = atari_report.ratios(results)
  results['ratios'] = ratios
  assert set(ratios) == {'ours', 'ours_blocks', 'ours_noframes'}
  assert ratios['ours']['memory']['value'] == pytest.approx(7 / 60)
  assert ratios['ours']['memory']['met']  # <= 1/8.
  assert not ratios['ours_blocks']['memory']['met']  # 1/20 > 1/50.
  assert ratios['ours']['insert']['met'] and ratios['ours']['sample']['met']
  assert not ratios['ours_blocks']['sample']['met']
  assert ratios['ours']['checkpoint_restore_time']['value'] == pytest.approx(
      0.075)
  assert ratios['ours_noframes']['memory']['met'] is None  # Reference.
  table = atari_report.format_table(results)
  assert '| server memory, B/step (RSS slope, 2nd half) | 6,000' in table
  assert '0.117x (1/8.6), met (<= 1/8)' in table
  assert '0.05x (1/20), NOT met (<= 1/50)' in table
  assert 'ours_blocks      50: 600, 100: 300' in table
  assert 'ours_blocks      50-100: 250; 1M: 0.30 GB, 10M: 3.0 GB' in table
  atari_report.plot(results, str(tmp_path / 'chart.png'))
  assert (tmp_path / 'chart.png').read_bytes().startswith(b'\x89PNG')
  results['stream']['stack_axis'] = 0
  other = dict(results, stream=dict(results['stream'], stack_axis=-1,
                                    observation='uint8[84, 84, 4]'))
  summary = atari_report.format_summary([results, other])
  rows = summary.splitlines()
  assert len(rows) == 4 and 'ours, per-window: insert / sample / memory' in (
      rows[0])
  for row, observation in zip(rows[2:], ('[4, 84, 84]', '[84, 84, 4]')):
    assert row.startswith(f'| Pong | uint8{observation} | 3.00x / 3.00x / '
                          '0.117x '), row
    assert ('| 1.00x (NOT met) / 0.50x (NOT met) / 0.05x (NOT met) |'
            in row), row


def test_the_pong_stream_is_cached_and_a_prefix_is_the_shorter_stream(
    tmp_path):
  made = atari_frames.cached_frames(str(tmp_path), 40, seed=3)
  assert made['observation'].shape == (40, 4, 84, 84)
  assert made['observation'].dtype == np.uint8
  assert list(made['step_type'][:2]) == [0, 1]  # FIRST, then MID.
  # Mid-episode, a stack continues the previous one (oldest frame first).
  assert np.array_equal(made['observation'][10][:3],
                        made['observation'][9][1:])
  prefix = atari_frames.cached_frames(str(tmp_path), 25, seed=3)  # Cached.
  for name in atari_frames.FIELDS:
    assert np.array_equal(prefix[name], made[name][:25]), name
  again = atari_frames.generate(25, seed=3)
  assert np.array_equal(again['observation'], prefix['observation'])
  other = atari_frames.cached_frames(str(tmp_path), 20, seed=3,
                                     game='Breakout')
  assert other['observation'].shape == (20, 4, 84, 84)
  assert not np.array_equal(other['observation'], made['observation'][:20])
  assert (tmp_path / 'atari_frames' / 'breakout_seed3' / 'meta.json').exists()


def test_the_stream_in_tf_agents_layout_holds_the_same_frames(tmp_path):
  made = atari_frames.cached_frames(str(tmp_path), 12, seed=3)
  first = atari_frames.trajectories(dict(made))
  last = atari_frames.trajectories(dict(made), stack_axis=-1)
  assert atari_frames.data_spec(-1).observation.shape == (84, 84, 4)
  for a, b in zip(first, last):
    assert b.observation.shape == (84, 84, 4)
    assert b.observation.base.flags.c_contiguous  # As FrameStack4 makes it.
    assert np.array_equal(np.moveaxis(b.observation, -1, 0), a.observation)
    assert a.action == b.action and a.step_type == b.step_type


def test_a_tiny_run_measures_and_reports_every_side(tmp_path):
  # One game, TF-Agents' last-axis layout (the layout tests check both
  # axes' windows). The zlib sides are left out to keep the test short (the
  # layout tests cover zlib buffers).
  workload = atari_lib.AtariWorkload(
      steps=600, curve_sizes=(200,), sample_seconds=1.0,
      sides=('stock', 'ours', 'ours_blocks', 'ours_noframes'))
  runs = atari_lib.run_all(workload, ['Pong'], [-1], str(tmp_path))
  assert len(runs) == 1
  results = runs[0]
  assert results['stream']['observation'] == 'uint8[84, 84, 4]'
  assert results['name'] == 'atari_pong_axis-1'
  sides = results['sides']
  assert list(sides) == list(workload.sides)
  for name, side in sides.items():
    assert side['steps'] == 600
    assert side['insert_steps_per_s'] > 0, name
    assert side['sample_windows_per_s'] > 0 and side['sample_batches'] > 0
    assert side['checkpoint_bytes'] > 0 and side['checkpoint_seconds'] > 0
    assert side['restore_seconds'] > 0
    assert side['restored_items'] == side['items'], name
    assert side['memory']['curve']['sizes'] == [200, 300, 600]
    # Every side holds the stream: its RSS grew.
    assert side['memory']['growth_bytes_per_step'] > 0, name
  # Per-window sides hold every window of 2 steps; packed items hold them
  # 63 to a block of 64 steps.
  windows = sides['stock']['items']
  assert 590 <= windows <= 599
  assert sides['ours']['items'] == sides['ours_noframes']['items'] == windows
  assert windows / 63 <= sides['ours_blocks']['items'] < windows / 20
  assert set(results['ratios']) == {'ours', 'ours_blocks', 'ours_noframes'}
  for ratios in results['ratios'].values():
    assert set(ratios) == set(atari_report.MEASURES)
    assert all(r['value'] > 0 for r in ratios.values())
  saved = json.loads((tmp_path / 'atari_pong_axis-1.json').read_text())
  assert set(saved['sides']) == set(sides)
  summary = json.loads((tmp_path / 'atari_summary.json').read_text())
  assert [(s['game'], s['stack_axis']) for s in summary] == [('Pong', -1)]
  assert summary[0]['ratios']['ours']['insert'] == pytest.approx(
      results['ratios']['ours']['insert']['value'])
  png = (tmp_path / 'atari_pong_axis-1.png').read_bytes()
  assert png.startswith(b'\x89PNG\r\n\x1a\n') and len(png) > 10_000
  table = atari_report.format_table(results)
  for label in ('stock TF-Agents', 'ours, per-window',
                'ours, packed items (64)', 'ours, frame_stack=False'):
    assert label in table
  assert (tmp_path / 'atari_frames' / 'pong_seed0' / 'observation.npy'
         ).exists()
  assert not (tmp_path / 'atari_work').exists()  # Checkpoints cleaned up.
