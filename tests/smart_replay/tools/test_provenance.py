"""tools.provenance: names of starter buffers, and reading without the apps."""

import os
import subprocess
import sys

import pytest

from smart_replay.tools import provenance


@pytest.mark.unit
def test_buffer_names(tmp_path):
  assert provenance.validate_buffer_name('office-1.a_b') == 'office-1.a_b'
  for bad in ('', '../x', 'a/b', '.hidden', 'a..b'):
    with pytest.raises(ValueError, match='buffer_name .* is not a plain name'):
      provenance.validate_buffer_name(bad)
  name = provenance.buffer_dir_name('office', 2, 2880)
  assert name == 'office_seq2_2880steps'
  os.makedirs(tmp_path / name / 'checkpoints')
  os.makedirs(tmp_path / 'office_seq3_10steps' / 'checkpoints')
  os.makedirs(tmp_path / 'office_seq2_10steps')  # No checkpoints.
  assert provenance.find_buffers(str(tmp_path), 'office', 2) == [
      str(tmp_path / name)]
  assert provenance.find_buffers(str(tmp_path / 'none'), 'office', 2) == []


@pytest.mark.unit
def test_unreadable_provenance_restarts_the_sessions(tmp_path):
  assert provenance.read_sessions(str(tmp_path)) == []
  (tmp_path / provenance.PROVENANCE_NAME).write_text(
      '{"sessions": [{"seed": 1}]}')
  assert provenance.read_sessions(str(tmp_path)) == [{'seed': 1}]


@pytest.mark.unit
def test_collection_state_says_what_a_buffer_holds():
  assert provenance.collection_state({}) is None  # Not a populated buffer.
  assert provenance.collection_state(
      {'env_steps': 1152, 'requested_env_steps': 1152, 'complete': True}
  ) == 'complete: 1,152 of 1,152 requested env steps'
  state = provenance.collection_state(
      {'env_steps': 53778, 'requested_env_steps': 200000, 'complete': False})
  assert state.startswith(
      'interrupted: 53,778 of 200,000 requested env steps (the directory '
      'keeps the requested total in its name;')
  # Files written before the counts had one name each.
  assert provenance.collection_state(
      {'steps_collected': 53778, 'total_steps_requested': 200000}) == state


def test_inspection_does_not_import_environments_or_policies():
  loaded = subprocess.run(
      [sys.executable, '-c', 'import sys, smart_replay.tools.inspection; '
       "print([m for m in sys.modules if m.startswith(('smart_replay.apps.envs',"
       " 'smart_replay.apps.policies'))])"],
      capture_output=True, text=True, check=True, timeout=300,
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(
          os.path.dirname(os.path.abspath(__file__))))))
  assert loaded.stdout.strip().splitlines()[-1] == '[]'
