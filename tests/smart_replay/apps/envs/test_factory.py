"""Tests for smart_replay.apps.envs.factory."""

import pytest

from smart_replay.apps.envs import factory
from smart_replay.apps.envs import thermal


def test_thermal_and_gym():
  assert isinstance(factory.make_environment('thermal'), thermal.ThermalZoneEnv)
  cartpole = factory.make_environment('gym:CartPole-v1', seed=3)
  assert cartpole.action_spec().maximum == 1


@pytest.mark.parametrize('name, match', [
    ('foo', "unknown env 'foo'; expected 'thermal', 'gymnasium:<id>'"),
    ('gym:NoSuchEnv-v0', "unknown Gym environment id 'NoSuchEnv-v0'"),
    ('gymnasium:NoSuchEnv-v0',
     "unknown Gymnasium environment id 'NoSuchEnv-v0'"),
])
def test_unknown_environments_are_named(name, match):
  with pytest.raises(ValueError, match=match):
    factory.make_environment(name)
