"""The command-line normalisation every binary shares."""

import pytest

from smart_replay.apps import binary

KNOWN = ['output_dir', 'overwrite', 'num_runs', 'verbose', 'verbosity']


@pytest.mark.unit
@pytest.mark.parametrize('argv, expected', [
    (['p', '--output-dir=x'], ['p', '--output_dir=x']),
    (['p', '--output-dir', 'x'], ['p', '--output_dir', 'x']),
    (['p', '--no-overwrite'], ['p', '--nooverwrite']),
    (['p', '--nooverwrite'], ['p', '--nooverwrite']),
    (['p', '--unknown-flag=1'], ['p', '--unknown-flag=1']),  # absl says so
    (['p', '-v'], ['p', '--verbose']),
    (['p', '-v', '1'], ['p', '-v', '1']),
    (['p', '--', '--output-dir=x', '-v'], ['p', '--', '--output-dir=x', '-v']),
])
def test_normalize_argv(argv, expected):
  assert binary.normalize_argv(argv, KNOWN) == expected
