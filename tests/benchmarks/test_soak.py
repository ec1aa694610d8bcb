"""Tests for smart_replay_benchmarks.soak_lib: settings, fit, verdict, a run."""

import math

import pytest

from smart_replay_benchmarks import soak_lib


@pytest.mark.unit
@pytest.mark.parametrize('field, value, message', [
    ('mode', [], r'mode must be one or more of checkpoint, sample, write'),
    ('mode', ['write', 'read'], r"got \['read', 'write'\]"),
    ('sampler', 'mine', r"sampler must be one of \('ours', 'stock'"),
    ('loop', 'graph', r'loop must be one of'),
    ('checkpoint_with', 'disk', r'checkpoint_with must be one of'),
])
def test_bad_settings_are_refused_with_the_field(field, value, message):
  with pytest.raises(ValueError, match=message):
    soak_lib.Settings(**{field: value})


@pytest.mark.unit
def test_the_slope_is_per_minute_from_the_start_and_skips_missing_values():
  readings = [(0.0, 900.0), (60.0, 100.0), (120.0, 102.0), (150.0, None),
              (180.0, 104.0)]
  assert soak_lib.fit_slope(readings, 60.0) == pytest.approx(2.0)
  assert math.isnan(soak_lib.fit_slope(readings, 100.0))  # Two points left.


def _soak(rss_per_min: float):
  settings = soak_lib.Settings(mode=['sample'], duration_s=60, warmup_s=30,
                               max_growth_mb_per_min=5.0)
  times = [t * 2.0 for t in range(46)]  # 0 to 90 s.
  readings = [(t, 500.0 + rss_per_min * t / 60) for t in times]
  malloc = [(t, None) for t in times]
  blocks = [(t, 1000 + 10 * t) for t in times]
  counts = {'steps': 0, 'batches': 900, 'checkpoints': 0}
  return soak_lib.result(settings, counts, readings, malloc, blocks,
                         tensorflow_version='2.x')


@pytest.mark.unit
def test_the_verdict_compares_the_measured_slope_with_the_bound():
  flat, growing = _soak(1.0), _soak(8.0)
  assert flat['passed'] and not growing['passed']
  assert growing['slope_mb_per_min'] == pytest.approx(8.0)
  assert growing['rss_start_mb'] == pytest.approx(504.0)  # At the warm-up.
  assert growing['python_blocks_per_min'] == pytest.approx(600.0)
  assert growing['python_blocks_per_batch'] == pytest.approx(1.0)
  assert growing['settings']['mode'] == ['sample']
  lines = soak_lib.summary(growing).splitlines()
  assert lines[0].startswith('soak sample (sampler ours, function loop;')
  assert '900 batches' in lines[0]
  assert lines[-1] == 'FAIL: RSS slope +8.00 MB/min, bound 5 MB/min'
  assert soak_lib.summary(flat).splitlines()[-1].startswith('PASS')


def test_a_short_soak_writes_samples_checkpoints_and_reads_rss():
  soak = soak_lib.run(soak_lib.Settings(
      duration_s=2.0, warmup_s=0.5, capacity=300, observation_size=4,
      batch_size=8, checkpoint_every_s=0.5, rss_every_s=0.25))
  counts = soak['counts']
  assert counts['steps'] > 0 and counts['batches'] > 0
  assert counts['checkpoints'] >= 1
  assert len(soak['readings']) >= 8
  assert soak['rss_peak_mb'] > 0
  assert soak['settings']['mode'] == ['checkpoint', 'sample', 'write']
  assert soak_lib.summary(soak).splitlines()[-1].startswith(('PASS', 'FAIL'))
