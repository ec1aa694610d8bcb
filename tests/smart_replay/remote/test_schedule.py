"""CheckpointSchedule: when a scheduled checkpoint is due, and retries."""

import pytest

from smart_replay.remote import checkpoint_schedule as schedule_lib
from smart_replay.remote import status


def _schedule(**kwargs):
  settings = dict(every_s=None, every_inserts=None, max_unsaved_s=None,
                  retry_s=30.0)
  settings.update(kwargs)
  schedule = schedule_lib.CheckpointSchedule(**settings)
  schedule.last_counts, schedule.last_time = (0, 0), 0.0
  return schedule


@pytest.mark.unit
def test_due_by_inserts_time_and_unsaved_age():
  schedule = _schedule(every_inserts=10, every_s=100, max_unsaved_s=5)
  assert schedule.due((3, 0), now=1.0) is None
  assert schedule.due((3, 0), now=6.0) == '3 inserts unsaved for 5 s'
  assert schedule.due((10, 0), now=6.0) == (
      '10 inserts and 10 inserts unsaved for 5 s')
  assert schedule.due((10, 0), now=100.0).startswith('every 100 s and ')


@pytest.mark.unit
def test_nothing_changed_is_not_saved_and_restarts_the_clock():
  schedule = _schedule(every_s=10)
  assert schedule.due((0, 0), now=11.0) is None
  assert schedule.last_time == 11.0
  assert schedule.due((0, 1), now=15.0) is None  # Only 4 s since.
  assert schedule.due((0, 1), now=21.0) == 'every 10 s'


@pytest.mark.unit
def test_failure_postpones_the_next_try_until_it_works_again():
  schedule = _schedule(every_inserts=1, retry_s=30)
  schedule.failed(OSError('disk full'), now=10.0)
  assert schedule.failing_since == (10.0, 'disk full')
  assert schedule.due((5, 0), now=20.0) is None
  assert schedule.due((5, 0), now=40.0) == '5 inserts'
  schedule.failed(OSError('still full'), now=40.0)
  assert schedule.failing_since == (10.0, 'still full')
  schedule.succeeded(now=70.0)
  assert schedule.failing_since is None and schedule.retry_at == 0.0


@pytest.mark.unit
def test_record_keeps_the_newest_checkpoint():
  schedule = _schedule()
  schedule.record('ckpt-000002', (5, 1), now=3.0)
  schedule.record('ckpt-000001', (4, 1), now=4.0)  # A slower, older save.
  assert schedule.last_checkpoint == 'ckpt-000002'
  assert schedule.last_counts == (5, 1) and schedule.last_time == 4.0
  assert schedule.holds((5, 1)) and not schedule.holds((6, 1))


@pytest.mark.unit
def test_checkpoints_compare_by_number_not_as_strings():
  schedule = _schedule()
  schedule.record('/z/checkpoints/ckpt-999999', (5, 1), now=1.0)
  schedule.record('/a/checkpoints/ckpt-1000000', (6, 1), now=2.0)
  assert schedule.last_checkpoint == '/a/checkpoints/ckpt-1000000'
  schedule.record('/z/checkpoints/ckpt-000003', (1, 0), now=3.0)
  assert schedule.last_checkpoint == '/a/checkpoints/ckpt-1000000'
  # A restore in place: the older checkpoint is what the buffer now holds.
  schedule.restored('/a/checkpoints/ckpt-000002', (2, 0), now=4.0)
  assert schedule.last_checkpoint == '/a/checkpoints/ckpt-000002'
  assert schedule.holds((2, 0)) and schedule.last_time == 4.0


@pytest.mark.unit
def test_the_status_line_tells_a_restore_from_a_crash():
  schedule = _schedule()
  stats = {'tables': {}}
  line = lambda loss: status.status_line(
      address='h:1', stats=stats, before=stats, elapsed_s=1.0,
      schedule=schedule, restart_loss=loss, now=1.0)
  assert 'at its crash' in line({'lost_items': 3, 'cause': 'crash'})
  restored = line({'lost_items': 598, 'cause': 'restore'})
  assert 'the last restore dropped 598 item(s)' in restored
  assert 'crash' not in restored


@pytest.mark.unit
def test_a_failed_attempt_is_logged_and_retried_later():
  schedule = _schedule(retry_s=30)

  def full_disk():
    raise OSError(28, 'No space left on device')
  assert schedule.attempt(full_disk, now=5.0) is None
  assert schedule.retry_at == 35.0 and 'No space' in schedule.failing_since[1]
  assert schedule.attempt(lambda: 'ckpt-000001', now=40.0) == 'ckpt-000001'
  assert schedule.failing_since is None


@pytest.mark.unit
@pytest.mark.parametrize('kwargs, match', [
    ({'every_s': 0}, 'checkpoint_every_s'),
    ({'every_inserts': 2.5}, 'checkpoint_every_inserts must be a positive integer'),
    ({'retry_s': None}, 'checkpoint_retry_s must be a positive number'),
    ({'max_unsaved_s': True}, 'max_unsaved_s'),
])
def test_bad_settings_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _schedule(**kwargs)


def test_saved_counts_are_the_buffer_tables_of_the_manifest(make_manager,
                                                            env):
  # A table served beside the buffer's (the policy variables) is in the
  # checkpoint's tables.tfrecord but not in its manifest's tables: it does
  # not count, as `total_counts` does not count it either.
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  from tests import testing  # pylint: disable=g-import-not-at-top
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 20, env=env)
  observer.flush()
  path = manager.checkpoint()
  live = schedule_lib.total_counts(manager.stats())
  assert live[0] > 0 and schedule_lib.saved_counts(path) == live
  manifest_path = os.path.join(path, 'manifest.json')
  with open(manifest_path) as f:
    manifest = json.load(f)
  manifest['tables'] = []  # As if its one table were served beside them.
  with open(manifest_path, 'w') as f:
    json.dump(manifest, f)
  assert schedule_lib.saved_counts(path) == (0, 0)
