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


@pytest.mark.unit
def test_known_noise_is_dropped_and_the_rest_kept():
  import logging  # pylint: disable=g-import-not-at-top
  noise = binary._DropNoise()  # pylint: disable=protected-access

  def record(message, module='learner', level=logging.WARNING):
    made = logging.LogRecord('x', level, f'{module}.py', 1, message, None,
                             None)
    made.module = module
    return made

  assert not noise.filter(record('Warning: checkpointing the training '
                                 'process is manually disabled.'))
  assert not noise.filter(record("Returning a port that wasn't given by "
                                 'portpicker: 1', module='portpicker',
                                 level=logging.INFO))
  assert noise.filter(record('Port 1 in use', module='portpicker'))
  assert noise.filter(record('The buffer is full'))
