"""plot_buffer writes a real PNG with the expected panels."""

import sys

from matplotlib import image
import pytest

from smart_replay.tools import plots
from smart_replay.core import tables
from tests import testing


def test_plot_has_the_panels_of_the_buffer(make_manager, tmp_path):
  manager = make_manager(capacity=500, table_configs=[
      tables.TableConfig(), tables.TableConfig(name='prioritized',
                                               sampler='prioritized')])
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 120)
  manager.checkpoint()
  out = tmp_path / 'figs' / 'buffer.png'
  titles = plots.plot_buffer(str(tmp_path / 'buffer'), str(out))
  assert [t.split(' (')[0] for t in titles] == [
      'Reward per step', 'Episode return', 'Episode length',
      'Observation ranges', "Priorities of table 'prioritized'"]
  assert 'Observation ranges (4 dimensions)' in titles  # temperature[3] + 1.
  with open(out, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  height, width, _ = image.imread(str(out)).shape
  assert (width, height) == (960, 960)  # 3 rows x 2 columns at 80 dpi.


def test_plot_without_prioritized_table_has_four_panels(make_manager,
                                                        tmp_path):
  manager = make_manager()
  _, observer = manager.create_replay_buffer()
  testing.run_actor(observer, 40)
  manager.checkpoint()
  out = str(tmp_path / 'b.png')
  assert len(plots.plot_buffer(str(tmp_path / 'buffer'), out)) == 4
  assert image.imread(out).shape[:2] == (640, 960)  # 2 rows x 2 columns.
  with pytest.raises(ValueError, match='sequence table'):
    plots.plot_buffer(str(tmp_path / 'buffer'), out, table='nope')
  empty = make_manager(checkpoint_dir=tmp_path / 'empty')
  empty.create_replay_buffer()
  empty.checkpoint()
  assert len(plots.plot_buffer(str(tmp_path / 'empty'), out)) == 4


@pytest.mark.unit
def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, 'matplotlib', None)
  with pytest.raises(ImportError, match=r'smart_replay\[plots\]'):
    plots.plot_buffer(str(tmp_path / 'none'), str(tmp_path / 'x.png'))
