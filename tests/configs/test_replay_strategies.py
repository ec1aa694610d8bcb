"""Every configs/replay_*.gin builds a working buffer on a real Reverb server."""

import glob
import os

import gin
import pytest

import smart_replay
from tests import testing

CONFIGS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')
STRATEGIES = sorted(glob.glob(os.path.join(CONFIGS, 'replay_*.gin')))


def test_there_is_a_config_per_strategy():
  names = {os.path.basename(p)[len('replay_'):-len('.gin')] for p in STRATEGIES}
  assert names == {'uniform', 'prioritized', 'uniform_and_prioritized',
                   'queue', 'lifo', 'ratio_limited', 'episodes'}


@pytest.mark.parametrize('path', STRATEGIES, ids=os.path.basename)
def test_strategy_config_writes_and_samples(path, tmp_path, data_spec):
  gin.clear_config()
  gin.parse_config_files_and_bindings(
      [os.path.join(CONFIGS, 'default.gin'), path], None)
  try:
    manager = smart_replay.ReplayBufferManager(
        data_spec=data_spec, checkpoint_dir=str(tmp_path / 'buffer'),
        sample_timeout_s=5, write_timeout_s=5)
  finally:
    gin.clear_config()
  with manager:
    if 'ratio_limited' in path:
      # 1000 items pass freely, then 800 / 8 more with nothing sampling.
      manager.check_prefill(1100)
      with pytest.raises(smart_replay.PrefillWouldBlockError):
        manager.check_prefill(1101)
      return
    manager.create_replay_buffer()
    testing.run_actor(manager.observer, 300, seed=1)
    manager.observer.end_episode()
    manager.flush()
    train_step = None
    for config in manager.table_configs:
      if config.importance_beta_final is not None:
        import tensorflow as tf  # pylint: disable=g-import-not-at-top
        train_step = tf.Variable(0, dtype=tf.int64)
      trajectory, info = next(iter(manager.get_dataset(
          batch_size=4, table_name=config.name, train_step=train_step)))
      assert trajectory.reward.shape[0] == info.weight.shape[0] > 0
    manager.checkpoint()
