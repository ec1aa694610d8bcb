"""Tests for smart_replay.utils.progress_log."""

import logging

import pytest

from smart_replay.utils import progress_log

pytestmark = pytest.mark.unit


def test_a_line_names_count_rate_and_eta_and_waits_its_interval(caplog):
  # The absl logger's own level: another test may have lowered absl's
  # verbosity in this process.
  with caplog.at_level(logging.INFO, logger='absl'):
    quiet = progress_log.ProgressLog('import', 100, 'items', every_s=3600)
    quiet.update(50)
    assert not caplog.records  # Within the interval: no line.
    progress = progress_log.ProgressLog('import', 100, 'items', every_s=0)
    progress.update(0)
    assert not caplog.records  # Nothing done yet: no rate to show.
    progress.update(25)
  message = caplog.records[-1].getMessage()
  assert message.startswith('import: 25/100 items, ')
  assert ' items/s, ETA ' in message and message.endswith(' s')


def test_a_bar_counts_and_closes(capsys):
  with progress_log.ProgressLog('export', 10, 'episodes', bar=True) as bar:
    bar.update(4)
    bar.update(10)
  shown = capsys.readouterr().err
  assert 'export' in shown and '10/10' in shown
