"""Tests for smart_replay.storage.ownership: a buffer folder only its user
can change (sshd's StrictModes), and storage that never follows a link.

The unit tests build each refusal on real folders (as root, another owner is
a `chown` to an unused uid). The attack tests replay security review 2's H2
and L3 with a real second Unix user (`tests.other_user`; root only): a folder
that user made in a shared sticky folder, with their `control.token` and an
`orphaned` link to root's files, is refused and nothing is deleted; with
umask 000 the folder a buffer makes is 0700, and that user can plant nothing.
"""

import logging
import os
import shutil
import stat
import tempfile

import pytest

import smart_replay
from smart_replay import errors
from smart_replay.remote import serving_record
from smart_replay.storage import checkpoint_folders
from smart_replay.storage import coordinated_records
from smart_replay.storage import durable
from smart_replay.storage import lock as buffer_lock
from smart_replay.storage import manifest as manifest_lib
from smart_replay.storage import ownership
from smart_replay.storage import store as checkpoint_store
from tests import other_user

# A uid no account has: "another user" for the unit tests (as root).
STRANGER = 54321
as_root = pytest.mark.skipif(os.geteuid() != 0,
                             reason='needs root to chown to another uid')


def _mode(path):
  return stat.S_IMODE(os.lstat(path).st_mode)


def _files(folder):
  return sorted(os.listdir(folder))


@pytest.fixture
def umask_000():
  old = os.umask(0)
  yield
  os.umask(old)


@pytest.fixture
def elsewhere(tmp_path):
  """Root's files, which a planted link points at."""
  folder = tmp_path / 'victim_data'
  folder.mkdir()
  for name in ('f1', 'f2', 'f3', 'f4'):
    (folder / name).write_text(name)
  return folder


@pytest.fixture
def shared_dir():
  """A folder like /tmp (mode 1777) that the other user can reach."""
  folder = tempfile.mkdtemp(prefix='smart_replay_shared_')
  os.chmod(folder, 0o1777)
  yield folder
  shutil.rmtree(folder)


# ------------------------------------------------------------ the folder

@pytest.mark.unit
def test_makes_the_folder_and_its_parents_0700_under_umask_000(tmp_path,
                                                              umask_000):
  del umask_000
  buffer_dir = tmp_path / 'a' / 'b' / 'buffer'
  assert ownership.own_buffer_dir(str(buffer_dir)) == str(buffer_dir)
  for folder in (tmp_path / 'a', tmp_path / 'a' / 'b', buffer_dir):
    assert _mode(folder) == 0o700, folder
  assert _files(buffer_dir) == []


@pytest.mark.unit
def test_makes_the_folder_0700_under_a_umask_that_clears_more(tmp_path):
  old = os.umask(0o277)
  try:
    ownership.own_buffer_dir(str(tmp_path / 'buffer'))
  finally:
    os.umask(old)
  assert _mode(tmp_path / 'buffer') == 0o700


@pytest.mark.unit
def test_an_existing_private_folder_is_used_as_it_is(tmp_path):
  (tmp_path / 'buffer').mkdir(mode=0o700)
  (tmp_path / 'buffer' / 'notes.txt').write_text('mine')
  ownership.own_buffer_dir(str(tmp_path / 'buffer'))
  assert _files(tmp_path / 'buffer') == ['notes.txt']


@pytest.mark.unit
def test_refuses_a_folder_that_is_a_link(tmp_path):
  (tmp_path / 'real').mkdir(mode=0o700)
  os.symlink(tmp_path / 'real', tmp_path / 'buffer')
  with pytest.raises(errors.UnsafeBufferDirError) as raised:
    ownership.own_buffer_dir(str(tmp_path / 'buffer'))
  message = str(raised.value)
  assert str(tmp_path / 'buffer') in message
  assert 'symbolic link' in message and str(tmp_path / 'real') in message
  assert 'choose a folder you own' in message
  assert raised.value.folder == str(tmp_path / 'buffer')
  assert isinstance(raised.value, PermissionError)


@pytest.mark.unit
@as_root
def test_refuses_a_folder_of_another_user(tmp_path):
  (tmp_path / 'buffer').mkdir(mode=0o700)
  os.chown(tmp_path / 'buffer', STRANGER, STRANGER)
  with pytest.raises(errors.UnsafeBufferDirError,
                     match=f'belongs to uid {STRANGER}, not to this process'
                     rf"'s user \(uid {os.geteuid()}") as raised:
    ownership.own_buffer_dir(str(tmp_path / 'buffer'))
  assert 'choose a folder you own' in str(raised.value)


@pytest.mark.unit
@pytest.mark.parametrize('mode', [0o770, 0o702, 0o777, 0o1777])
def test_refuses_a_folder_group_or_others_can_write(tmp_path, mode):
  buffer_dir = tmp_path / 'buffer'
  buffer_dir.mkdir()
  os.chmod(buffer_dir, mode)
  with pytest.raises(errors.UnsafeBufferDirError) as raised:
    ownership.own_buffer_dir(str(buffer_dir))
  message = str(raised.value)
  assert f'it has mode {mode:04o}' in message
  assert f'`chmod go-w {buffer_dir}`' in message


@pytest.mark.unit
def test_warns_once_about_a_folder_others_can_read(tmp_path, caplog):
  buffer_dir = tmp_path / 'buffer'
  buffer_dir.mkdir()
  os.chmod(buffer_dir, 0o755)
  with caplog.at_level(logging.WARNING):
    ownership.own_buffer_dir(str(buffer_dir))
    ownership.own_buffer_dir(str(buffer_dir))
  warnings = [r.getMessage() for r in caplog.records
              if str(buffer_dir) in r.getMessage()]
  assert warnings == [
      f'The buffer folder {buffer_dir} has mode 0755: group or others can read '
      f'its checkpoints (every stored item). Run `chmod 700 {buffer_dir}`.']
  assert _mode(buffer_dir) == 0o755  # Left as it is.


@pytest.mark.unit
def test_a_file_is_not_a_folder(tmp_path):
  (tmp_path / 'buffer').write_text('')
  with pytest.raises(NotADirectoryError, match='is a file, not a folder'):
    ownership.own_buffer_dir(str(tmp_path / 'buffer'))


@pytest.mark.unit
def test_an_empty_path_is_refused():
  with pytest.raises(ValueError, match="got ''"):
    ownership.own_buffer_dir('')


# ------------------------------------------------------- folders above it

@pytest.mark.unit
def test_refuses_a_parent_others_can_write_without_a_sticky_bit(tmp_path):
  os.chmod(tmp_path, 0o777)
  try:
    with pytest.raises(errors.UnsafeBufferDirError) as raised:
      ownership.own_buffer_dir(str(tmp_path / 'buffer'))
  finally:
    os.chmod(tmp_path, 0o700)
  message = str(raised.value)
  assert f'the folder {tmp_path} above it has mode 0777' in message
  assert f'`chmod go-w {tmp_path}`' in message


@pytest.mark.unit
def test_accepts_a_sticky_parent_like_tmp(tmp_path):
  os.chmod(tmp_path, 0o1777)
  try:
    ownership.own_buffer_dir(str(tmp_path / 'buffer'))
  finally:
    os.chmod(tmp_path, 0o700)
  assert _mode(tmp_path / 'buffer') == 0o700


@pytest.mark.unit
@as_root
def test_refuses_a_parent_of_another_user(tmp_path):
  (tmp_path / 'theirs').mkdir(mode=0o755)
  os.chown(tmp_path / 'theirs', STRANGER, STRANGER)
  with pytest.raises(errors.UnsafeBufferDirError,
                     match=f'the folder {tmp_path / "theirs"} above it belongs'
                     f' to uid {STRANGER}'):
    ownership.own_buffer_dir(str(tmp_path / 'theirs' / 'buffer'))
  assert not os.path.exists(tmp_path / 'theirs' / 'buffer')  # Made nothing.


@pytest.mark.unit
@as_root
def test_refuses_a_link_on_the_way_that_another_user_owns(tmp_path):
  (tmp_path / 'real').mkdir(mode=0o700)
  os.symlink(tmp_path / 'real', tmp_path / 'link')
  os.lchown(tmp_path / 'link', STRANGER, STRANGER)
  with pytest.raises(errors.UnsafeBufferDirError,
                     match=f'the link {tmp_path / "link"} above it belongs'):
    ownership.own_buffer_dir(str(tmp_path / 'link' / 'buffer'))


@pytest.mark.unit
def test_follows_an_own_link_on_the_way_and_checks_where_it_leads(tmp_path):
  (tmp_path / 'open').mkdir()
  os.chmod(tmp_path / 'open', 0o777)
  (tmp_path / 'open' / 'real').mkdir(mode=0o700)
  os.symlink(tmp_path / 'open' / 'real', tmp_path / 'link')
  with pytest.raises(errors.UnsafeBufferDirError,
                     match=f'the folder {tmp_path / "open"} above it has mode '
                     '0777'):
    ownership.own_buffer_dir(str(tmp_path / 'link' / 'buffer'))
  os.chmod(tmp_path / 'open', 0o755)
  ownership.own_buffer_dir(str(tmp_path / 'link' / 'buffer'))
  assert _mode(tmp_path / 'open' / 'real' / 'buffer') == 0o700


# ------------------------------------------------------ entries inside it

@pytest.mark.unit
def test_known_entries_are_the_names_the_buffer_uses():
  used = {checkpoint_folders.CHECKPOINTS_DIR, checkpoint_folders.REVERB_DIR,
          checkpoint_folders.ORPHANED_DIR, checkpoint_folders.REPLACED_DIR,
          checkpoint_folders.JOURNAL_DIR, durable.ORPHANED_DIR, coordinated_records.RECORDS_DIR,
          buffer_lock.LOCK_FILE, serving_record.RECORD_FILE,
          serving_record.RECORD_FILE + '.tmp',
          # control/'s secrets: the tokens, its certificate with its key.
          'control.token', 'reader.token', 'control.pem'}
  assert used <= set(ownership.KNOWN_ENTRIES), used - set(
      ownership.KNOWN_ENTRIES)


@pytest.mark.unit
@pytest.mark.parametrize('name', ownership.KNOWN_ENTRIES)
def test_refuses_a_known_entry_that_is_a_link(tmp_path, elsewhere, name):
  buffer_dir = tmp_path / 'buffer'
  buffer_dir.mkdir(mode=0o700)
  os.symlink(elsewhere, buffer_dir / name)
  with pytest.raises(errors.UnsafeBufferDirError) as raised:
    ownership.own_buffer_dir(str(buffer_dir))
  message = str(raised.value)
  assert f'{buffer_dir / name} in a buffer folder: it is a symbolic link' in (
      message)
  assert f'`rm {buffer_dir / name}`' in message
  assert _files(elsewhere) == ['f1', 'f2', 'f3', 'f4']


@pytest.mark.unit
@as_root
def test_refuses_a_known_entry_of_another_user(tmp_path):
  buffer_dir = tmp_path / 'buffer'
  buffer_dir.mkdir(mode=0o700)
  (buffer_dir / 'control.token').write_text('planted\n')
  os.chown(buffer_dir / 'control.token', STRANGER, STRANGER)
  with pytest.raises(errors.UnsafeBufferDirError,
                     match=f'its entry {buffer_dir / "control.token"} belongs '
                     f'to uid {STRANGER}'):
    ownership.own_buffer_dir(str(buffer_dir))


@pytest.mark.unit
def test_other_links_in_the_folder_are_left_alone(tmp_path, elsewhere):
  buffer_dir = tmp_path / 'buffer'
  buffer_dir.mkdir(mode=0o700)
  os.symlink(elsewhere, buffer_dir / 'my_notes')  # Not a name it uses.
  ownership.own_buffer_dir(str(buffer_dir))


@pytest.mark.unit
def test_private_dir_makes_0700_and_refuses_a_link(tmp_path, elsewhere,
                                                   umask_000):
  del umask_000
  made = ownership.private_dir(str(tmp_path / 'orphaned'))
  assert made == str(tmp_path / 'orphaned') and _mode(made) == 0o700
  os.symlink(elsewhere, tmp_path / 'checkpoints')
  with pytest.raises(errors.UnsafeBufferDirError, match='symbolic link'):
    ownership.private_dir(str(tmp_path / 'checkpoints'))
  with pytest.raises(errors.UnsafeBufferDirError, match='symbolic link'):
    ownership.private_dir(str(tmp_path / 'checkpoints' / 'inner'))
  assert _files(elsewhere) == ['f1', 'f2', 'f3', 'f4']


# ------------------------------------------- storage never follows a link

@pytest.mark.unit
def test_real_folder_tells_folders_and_refuses_links(tmp_path, elsewhere):
  (tmp_path / 'folder').mkdir()
  (tmp_path / 'file').write_text('')
  os.symlink(elsewhere, tmp_path / 'link')
  assert ownership.real_folder(str(tmp_path / 'folder'))
  assert not ownership.real_folder(str(tmp_path / 'file'))
  assert not ownership.real_folder(str(tmp_path / 'missing'))
  with pytest.raises(errors.UnsafeBufferDirError, match='link'):
    ownership.real_folder(str(tmp_path / 'link'))


@pytest.mark.unit
def test_orphaned_link_is_refused_and_its_target_kept(tmp_path, elsewhere):
  os.symlink(elsewhere, tmp_path / durable.ORPHANED_DIR)
  (tmp_path / 'interrupted').mkdir()
  with pytest.raises(errors.UnsafeBufferDirError, match='orphaned'):
    durable.bound_orphaned(str(tmp_path), keep_orphaned=1)
  with pytest.raises(errors.UnsafeBufferDirError, match='orphaned'):
    durable.set_aside(str(tmp_path), str(tmp_path / 'interrupted'),
                      reason='a test', keep_orphaned=1)
  with pytest.raises(errors.UnsafeBufferDirError, match='orphaned'):
    durable.remove(str(tmp_path / durable.ORPHANED_DIR / 'f1'))
  with pytest.raises(errors.UnsafeBufferDirError, match='orphaned'):
    durable.remove_interrupted_deletions(
        str(tmp_path / durable.ORPHANED_DIR))
  assert _files(elsewhere) == ['f1', 'f2', 'f3', 'f4']
  assert (tmp_path / 'interrupted').is_dir()


@pytest.mark.unit
def test_links_inside_orphaned_are_removed_not_followed(tmp_path, elsewhere):
  aside = tmp_path / durable.ORPHANED_DIR
  aside.mkdir()
  os.symlink(elsewhere, aside / 'old_link')
  os.symlink(elsewhere, aside / '.deleting-half')  # A crash's leftover.
  os.utime(aside / 'old_link', (1, 1), follow_symlinks=False)
  (tmp_path / 'new').mkdir()
  durable.set_aside(str(tmp_path), str(tmp_path / 'new'), reason='a test',
                    keep_orphaned=1)
  assert _files(aside) == ['new']
  assert _files(elsewhere) == ['f1', 'f2', 'f3', 'f4']


@pytest.mark.unit
def test_remove_tree_removes_a_link_itself(tmp_path, elsewhere):
  os.symlink(elsewhere, tmp_path / 'ckpt-000001')
  durable.remove_tree(str(tmp_path / 'ckpt-000001'))
  assert not os.path.lexists(tmp_path / 'ckpt-000001')
  assert _files(elsewhere) == ['f1', 'f2', 'f3', 'f4']


@pytest.mark.unit
def test_fsync_tree_skips_links(tmp_path, elsewhere):
  (tmp_path / 'saved').mkdir()
  (tmp_path / 'saved' / 'DONE').write_text('')
  os.symlink(elsewhere / 'f1', tmp_path / 'saved' / 'link')
  durable.fsync_tree(str(tmp_path / 'saved'))


@pytest.mark.unit
def test_a_store_refuses_a_planted_reverb_link(tmp_path, elsewhere):
  (tmp_path / 'buffer').mkdir(mode=0o700)
  os.symlink(elsewhere, tmp_path / 'buffer' / checkpoint_folders.REVERB_DIR)
  with pytest.raises(errors.UnsafeBufferDirError, match=r'\.reverb'):
    checkpoint_store.CheckpointStore(str(tmp_path / 'buffer'))
  with pytest.raises(errors.UnsafeBufferDirError, match=r'\.reverb'):
    buffer_lock.BufferLock(str(tmp_path / 'buffer')).acquire()
  assert _files(elsewhere) == ['f1', 'f2', 'f3', 'f4']


@pytest.mark.unit
def test_what_storage_writes_is_private_under_umask_000(tmp_path, umask_000):
  del umask_000
  store = checkpoint_store.CheckpointStore(str(tmp_path / 'buffer'))
  assert not os.path.exists(store.root)  # Made when the buffer starts:
  assert _mode(store.prepare_reverb_root()) == 0o700
  assert _mode(store.root) == 0o700
  with buffer_lock.BufferLock(store.root) as held:
    assert _mode(held.path) == 0o600
  (tmp_path / 'buffer' / 'damaged').mkdir()
  durable.set_aside(store.root, str(tmp_path / 'buffer' / 'damaged'),
                    reason='a test')
  assert _mode(tmp_path / 'buffer' / durable.ORPHANED_DIR) == 0o700
  manifest_lib.write(str(tmp_path / 'buffer' / 'm.json'), {'a': 1})
  assert _mode(tmp_path / 'buffer' / 'm.json') == 0o600
  record = coordinated_records.write_record(
      store.root, {'id': '20261126T061500000001Z-0a1b2c3d',
                   'created_utc': 'now', 'shard': 0,
                   'shards': [{'address': 'h0:8000', 'path': '/a/ckpt-000001',
                               'counts': {}}]})
  assert _mode(os.path.dirname(record)) == 0o700
  assert _mode(record) == 0o600


# ------------------------------------------------------ a whole manager

@as_root
def test_a_manager_refuses_a_planted_folder_before_reading_it(
    make_manager, tmp_path, elsewhere):
  buffer_dir = tmp_path / 'buffer'
  buffer_dir.mkdir(mode=0o755)
  (buffer_dir / 'control.token').write_text('planted\n')
  os.symlink(elsewhere, buffer_dir / 'orphaned')
  os.chown(buffer_dir, STRANGER, STRANGER)
  with pytest.raises(smart_replay.UnsafeBufferDirError,
                     match=f'belongs to uid {STRANGER}'):
    make_manager(buffer_dir)
  assert _files(elsewhere) == ['f1', 'f2', 'f3', 'f4']


def test_a_buffer_made_under_umask_000_is_private(make_manager, tmp_path,
                                                  umask_000):
  del umask_000
  manager = make_manager(tmp_path / 'run' / 'buffer')
  manager.create_replay_buffer()
  path = manager.checkpoint()
  buffer_dir = tmp_path / 'run' / 'buffer'
  for folder in (tmp_path / 'run', buffer_dir, buffer_dir / 'checkpoints',
                 buffer_dir / '.reverb'):
    assert _mode(folder) == 0o700, folder
  for name in (os.path.join(path, manifest_lib.MANIFEST_NAME),
               buffer_dir / buffer_lock.LOCK_FILE):
    assert _mode(name) == 0o600, name


# ----------------------------------- security review 2, H2 and L3: a real user

def test_h2_a_folder_another_user_planted_is_refused_and_nothing_deleted(
    make_manager, shared_dir, elsewhere):
  other = other_user.require()
  buffer_dir = os.path.join(shared_dir, 'victim_buffer')
  planted = other.run_python(
      'import os, sys\n'
      f'os.mkdir({buffer_dir!r})\n'
      f'os.chdir({buffer_dir!r})\n'
      "fd = os.open('control.token', os.O_WRONLY | os.O_CREAT, 0o600)\n"
      "os.write(fd, b'other-user-knows-this-token\\n')\n"
      f"os.symlink({str(elsewhere)!r}, 'orphaned')\n"
      "print('planted')\n", timeout_s=120)
  assert planted.returncode == 0, planted.stderr
  assert os.lstat(buffer_dir).st_uid == other.uid
  with pytest.raises(smart_replay.UnsafeBufferDirError) as raised:
    make_manager(buffer_dir)  # The manager of smart-replay-serve, too.
  message = str(raised.value)
  assert buffer_dir in message
  assert f'belongs to uid {other.uid} ({other.name})' in message
  assert f"this process's user (uid {os.geteuid()}" in message
  assert 'choose a folder you own' in message
  # Storage refuses the link on its own too (a folder that became root's).
  with pytest.raises(errors.UnsafeBufferDirError, match='orphaned'):
    durable.bound_orphaned(buffer_dir, keep_orphaned=1)
  assert _files(elsewhere) == ['f1', 'f2', 'f3', 'f4']
  assert os.path.islink(os.path.join(buffer_dir, 'orphaned'))  # Untouched.


def test_h2_a_link_planted_before_a_chmod_is_still_refused(
    make_manager, shared_dir, elsewhere):
  other = other_user.require()
  buffer_dir = os.path.join(shared_dir, 'buffer')
  os.mkdir(buffer_dir)
  os.chmod(buffer_dir, 0o777)  # E.g. made by an earlier run under umask 000.
  planted = other.run_python(
      f"import os; os.symlink({str(elsewhere)!r}, "
      f"{os.path.join(buffer_dir, 'orphaned')!r})", timeout_s=120)
  assert planted.returncode == 0, planted.stderr
  with pytest.raises(smart_replay.UnsafeBufferDirError, match='mode 0777'):
    make_manager(buffer_dir)
  os.chmod(buffer_dir, 0o700)  # The fix, without looking inside first.
  with pytest.raises(smart_replay.UnsafeBufferDirError) as raised:
    make_manager(buffer_dir)
  assert 'orphaned in a buffer folder: it is a symbolic link' in str(
      raised.value)
  assert _files(elsewhere) == ['f1', 'f2', 'f3', 'f4']


def test_h2_l3_under_umask_000_the_other_user_can_plant_nothing(
    make_manager, shared_dir, umask_000):
  del umask_000
  other = other_user.require()
  buffer_dir = os.path.join(shared_dir, 'buffer')
  manager = make_manager(buffer_dir)
  manager.create_replay_buffer()
  checkpoint = manager.checkpoint()
  info = os.lstat(buffer_dir)
  assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), 0o700)
  before = _files(buffer_dir)
  manifest = os.path.join(checkpoint, manifest_lib.MANIFEST_NAME)
  attempts = other.run_python(
      'import os\n'
      f'buffer = {buffer_dir!r}\n'
      'attempts = {\n'
      "  'list': lambda: os.listdir(buffer),\n"
      "  'plant_token': lambda: open(os.path.join(buffer, 'control.token'),"
      " 'x'),\n"
      "  'plant_link': lambda: os.symlink('/', os.path.join(buffer,"
      " 'orphaned')),\n"
      f"  'read_manifest': lambda: open({manifest!r}).read(),\n"
      "  'rename': lambda: os.rename(buffer, buffer + '.gone'),\n"
      "  'remove': lambda: os.rmdir(buffer),\n"
      '}\n'
      'for name, attempt in attempts.items():\n'
      '  try:\n'
      '    attempt()\n'
      "    print(name, 'SUCCEEDED')\n"
      '  except OSError as e:\n'
      "    print(name, type(e).__name__)\n", timeout_s=120)
  assert attempts.returncode == 0, attempts.stderr
  assert attempts.stdout.split('\n')[:-1] == [
      f'{name} PermissionError' for name in (
          'list', 'plant_token', 'plant_link', 'read_manifest', 'rename',
          'remove')], attempts.stdout
  assert manager.checkpoint()  # Still ours, and saving works.
  assert set(_files(buffer_dir)) == set(before)
