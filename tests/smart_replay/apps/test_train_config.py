"""Tests for smart_replay.apps.train_config (train_from_starter's groups)."""

import os

import gin
import pytest

from smart_replay.apps import configs
from smart_replay.apps import train_config as tc


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _config(**fields):
  fields.setdefault('starter_dir', 'starter')
  fields.setdefault('run_dir', 'run')
  return tc.TrainConfig.from_fields(**fields)


@pytest.mark.unit
def test_fields_go_to_their_groups():
  config = _config(agent='dqn', seed=3, starter_mode='mix',
                   starter_fraction=0.8, starter_fraction_final=0.2,
                   starter_fraction_steps=100, num_train_steps=40,
                   batch_size=8, resume=True, log_every_s=0.0)
  assert config.agent_setup == tc.AgentSetup(agent='dqn', seed=3)
  assert config.starter.starter_dir == 'starter'
  assert config.starter.schedule.value(50) == pytest.approx(0.5)
  assert config.loop.num_train_steps == 40 and config.loop.batch_size == 8
  assert config.output.run_dir == os.path.abspath('run')
  assert config.output.buffer_dir == os.path.join(os.path.abspath('run'),
                                                  'buffer')
  assert config.output.resume and config.output.log_every_s == 0.0
  assert tc.field_names(tc.StarterUse)[-1] == 'starter_fraction_schedule'


@pytest.mark.unit
def test_copy_and_none_have_no_schedule():
  assert _config().starter.schedule is None
  assert _config(starter_mode='none').starter.schedule is None
  assert _config(starter_mode='mix').starter.schedule.value(0) == 0.5


@pytest.mark.unit
@pytest.mark.parametrize('fields, error, match', [
    ({'num_train_steps': 0}, ValueError,
     'num_train_steps must be a positive integer, got 0'),
    ({'checkpoint_every': 1.5}, ValueError, 'checkpoint_every.*1.5'),
    ({'eval_interval': -1}, ValueError,
     r'eval_interval must be a non-negative integer \(0: evaluate at the '
     r'end only\), got -1'),
    ({'eval_episodes': True}, ValueError, 'eval_episodes.*True'),
    ({'resume': True, 'overwrite': True}, ValueError, 'exclude each other'),
    ({'log_every_s': -1}, ValueError, 'log_every_s.*-1'),
    ({'run_dir': ''}, ValueError, "run_dir must be a non-empty path, got ''"),
    ({'agent': 'ppo'}, ValueError,
     r"unknown agent 'ppo'; expected one of \('auto', 'dqn', 'sac'\)"),
    ({'seed': None}, ValueError, 'seed must be an integer, got None'),
    ({'starter_mode': 'blend'}, ValueError,
     "starter_mode must be one of .*'blend'"),
    ({'starter_fraction': 0.3}, ValueError,
     "starter_fraction=0.3: only for starter_mode='mix'"),
    ({'starter_mode': 'mix', 'starter_fraction_final': 0.1}, ValueError,
     'starter_fraction_steps=None'),
    ({'batch_sizes': 8}, TypeError, r"unknown arguments \['batch_sizes'\]"),
])
def test_a_bad_field_is_named(fields, error, match):
  with pytest.raises(error, match=match):
    _config(**fields)


@pytest.mark.unit
def test_the_loop_checks_first_as_train_from_starter_always_did():
  with pytest.raises(ValueError, match='batch_size'):
    _config(batch_size=0, resume=True, overwrite=True, agent='ppo')


@pytest.mark.unit
def test_gin_fills_what_the_caller_leaves_out():
  gin.parse_config(['TrainLoop.batch_size = 256', "AgentSetup.agent = 'sac'",
                    'TrainLoop.num_train_steps = 10'])
  config = _config(num_train_steps=20)
  assert config.loop.batch_size == 256 and config.agent_setup.agent == 'sac'
  assert config.loop.num_train_steps == 20  # The caller wins.


@pytest.mark.unit
def test_old_and_misspelled_bindings_fail_at_parse():
  with pytest.raises(ValueError, match="No configurable matching "
                                       "'train_from_starter'"):
    gin.parse_config('train_from_starter.num_train_steps = 3')
  with pytest.raises(ValueError, match="'TrainLoop' doesn't have a parameter "
                                       "named 'num_train_step'"):
    gin.parse_config('TrainLoop.num_train_step = 3')


@pytest.mark.unit
@pytest.mark.parametrize('name, agent, steps',
                         [('train_dqn_cartpole.gin', 'dqn', 3000),
                          ('train_sac_thermal.gin', 'sac', 5000)])
def test_shipped_train_configs_bind_the_groups(name, agent, steps):
  gin.parse_config_file(configs.resolve(name))
  config = _config()
  assert config.agent_setup.agent == agent
  assert config.loop.num_train_steps == steps


@pytest.mark.unit
def test_loop_phases_and_evaluations():
  loop = tc.TrainLoop(num_train_steps=120, train_steps_per_iteration=50,
                      eval_interval=100, batch_size=4)
  assert loop.samples_per_iteration == 200
  assert [loop.train_steps_from(s) for s in (0, 50, 100)] == [50, 50, 20]
  assert [s for s in (50, 100, 120) if loop.evaluates_after(s)] == [100]
  assert not tc.TrainLoop(eval_interval=0).evaluates_after(100)


@pytest.mark.unit
def test_config_groups_are_typed():
  config = _config()
  with pytest.raises(ValueError, match='loop must be a TrainLoop'):
    tc.TrainConfig(agent_setup=config.agent_setup, starter=config.starter,
                   loop=None, output=config.output)
