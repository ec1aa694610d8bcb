"""cli.as_flags: library messages name arguments; binaries show flags."""

import pytest

from smart_replay.apps import cli


@pytest.mark.unit
def test_arguments_become_flags():
  message = ('pass resume=True to continue it, or overwrite=True to replace '
             'it; checkpoint_every_run=False; with sequence_length=2; '
             'Pass env= explicitly; seed=3 stays')
  assert cli.as_flags(message, ['resume', 'overwrite', 'checkpoint_every_run',
                                'sequence_length', 'env']) == (
      'pass --resume to continue it, or --overwrite to replace it; '
      '--nocheckpoint_every_run; with --sequence_length=2; Pass --env= '
      'explicitly; seed=3 stays')
  assert cli.as_flags('--resume and presume=True', ['resume']) == (
      '--resume and presume=True')
