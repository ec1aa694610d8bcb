"""plot_buffer writes a real PNG with the expected panels."""

import sys

from matplotlib import image
import numpy as np
import pytest

from smart_replay.config import tables
from smart_replay.tools import plots
from tests import testing


def _every_axis_is_labelled(figure):
  drawn = [a for a in figure.axes if a.axison]
  assert drawn
  for axis in drawn:
    assert axis.get_title() and axis.get_xlabel() and axis.get_ylabel(), (
        axis.get_title())


def test_plot_has_the_panels_of_the_buffer(make_manager, tmp_path):
  manager = make_manager(capacity=500, table_configs=[
      tables.TableConfig(), tables.TableConfig(name='prioritized',
                                               sampler='prioritized')])
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 120)
  manager.checkpoint()
  out = tmp_path / 'figs' / 'buffer.png'
  titles = plots.plot_buffer(str(tmp_path / 'buffer'), str(out))
  assert [t.split(' (')[0].split(':')[0] for t in titles][:5] == [
      'Reward per step', 'Reward over the stored steps', 'Episode return',
      'Episode length', 'Action']
  assert [t.split(' (')[0] for t in titles][-5:] == [
          f'Observation: observation[{d}]' for d in range(4)] + [
              "Priorities of table 'prioritized'"]
  with open(out, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  figure, _ = plots.make_figure(plots.read_buffer(str(tmp_path / 'buffer')))
  _every_axis_is_labelled(figure)


def test_discrete_actions_get_one_bar_per_value_named(tmp_path):
  from smart_replay.apps import populate  # pylint: disable=g-import-not-at-top
  result = populate.populate_starter_buffer(
      buffer_name='cp', output_dir=str(tmp_path), env='gymnasium:CartPole-v1',
      policy='random', num_runs=1, steps_per_run=200, show_progress=False)
  data = plots.read_buffer(result.buffer_dir)
  assert data.discrete_action and data.actions.shape[1] == 1
  figure, titles = plots.make_figure(data)
  actions = next(a for a in figure.axes if a.get_title().startswith('Actions'))
  assert len(actions.patches) == 2
  assert [t.get_text() for t in actions.get_xticklabels()] == [
      '0: push left', '1: push right']
  assert 'Observation: pole angle' in titles
  _every_axis_is_labelled(figure)


def test_constant_values_are_one_labelled_bar_and_nan_is_counted():
  plt = plots.pyplot()
  figure, (constant, mixed, few) = plt.subplots(1, 3)
  assert plots.histogram(constant, np.full(50, 19.0), xlabel='t (°C)',
                         ylabel='steps') == ''
  assert len(constant.patches) == 1
  assert any('constant = 19' in t.get_text() for t in constant.texts)
  note = plots.histogram(mixed, np.array([1.0, np.nan, np.inf, 2.0, 3.5]),
                         xlabel='x', ylabel='steps')
  assert note == ', 2 NaN/inf left out'
  plots.histogram(few, np.array([0, 1, 1, 0, 1]), xlabel='flag',
                  ylabel='steps')
  assert len(few.patches) == 2  # one bar per value, not 50 bins
  plt.close(figure)


def test_known_environment_gets_names_and_units(tmp_path):
  from smart_replay.apps import populate  # pylint: disable=g-import-not-at-top
  result = populate.populate_starter_buffer(
      buffer_name='office', output_dir=str(tmp_path), num_runs=1,
      steps_per_run=100, show_progress=False)
  data = plots.read_buffer(result.buffer_dir)
  assert data.env == 'thermal' and not data.discrete_action
  figure, titles = plots.make_figure(data)
  assert 'Observation: indoor temperature' in titles
  assert 'Action: HVAC power u' in titles
  temperature = next(a for a in figure.axes
                     if a.get_title() == 'Observation: indoor temperature')
  assert temperature.get_xlabel() == 'indoor temperature (°C)'
  _every_axis_is_labelled(figure)


def test_plot_without_prioritized_table_and_empty(make_manager, tmp_path):
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 40)
  manager.checkpoint()
  out = str(tmp_path / 'b.png')
  titles = plots.plot_buffer(str(tmp_path / 'buffer'), out)
  assert not any(t.startswith('Priorities') for t in titles)
  assert image.imread(out).shape[:2] == (891, 1512)  # 3 rows x 4 columns
  with pytest.raises(ValueError, match='sequence table'):
    plots.plot_buffer(str(tmp_path / 'buffer'), out, table='nope')
  empty = make_manager(checkpoint_dir=tmp_path / 'empty')
  empty.create_replay_buffer()
  empty.checkpoint()
  assert plots.plot_buffer(str(tmp_path / 'empty'), out)


@pytest.mark.unit
def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, 'matplotlib', None)
  with pytest.raises(ImportError, match=r'smart_replay\[plots\]'):
    plots.plot_buffer(str(tmp_path / 'none'), str(tmp_path / 'x.png'))
