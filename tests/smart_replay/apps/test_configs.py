"""Shipped gin configs are found by name; a real path always wins."""

import pytest

from smart_replay.apps import configs


@pytest.mark.unit
def test_shipped_configs_by_name(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert 'populate_thermal.gin' in configs.shipped()
  for name in ('populate_thermal.gin', 'populate_thermal',
               'configs/populate_thermal.gin'):
    path = configs.resolve(name)
    assert path.endswith('populate_thermal.gin')
    with open(path) as f:
      assert 'populate_starter_buffer' in f.read()


@pytest.mark.unit
def test_a_path_wins_and_unknown_names_list_the_shipped(tmp_path,
                                                         monkeypatch):
  monkeypatch.chdir(tmp_path)
  own = tmp_path / 'populate_thermal.gin'
  own.write_text('# mine\n')
  assert configs.resolve('populate_thermal.gin') == 'populate_thermal.gin'
  with pytest.raises(FileNotFoundError, match='shipped: default.gin'):
    configs.resolve('nope.gin')
  with pytest.raises(FileNotFoundError):
    configs.resolve('elsewhere/serve.gin')
