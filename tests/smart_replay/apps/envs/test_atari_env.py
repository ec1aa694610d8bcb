"""'atari:<Game>': a real ALE game with DQN preprocessing, as users run it."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tf_agents.environments import py_environment
from tf_agents.policies import random_py_policy
from tf_agents.specs import array_spec

import smart_replay
from smart_replay import errors
from smart_replay.apps.envs import atari_env
from smart_replay.apps.envs import factory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))))
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable),
                              'smart-replay-populate')


def test_pong_is_a_py_environment_of_stacked_uint8_frames():
  env = factory.make_environment('atari:Pong', seed=0)
  assert isinstance(env, py_environment.PyEnvironment)
  spec = env.observation_spec()
  assert (spec.shape, spec.dtype) == ((4, 84, 84), np.uint8)
  # Scalar bounds: manifests and provenance do not list 28,224 of them.
  assert (spec.minimum.shape, int(spec.minimum), int(spec.maximum)) == (
      (), 0, 255)
  action = env.action_spec()
  assert (action.dtype, int(action.minimum), int(action.maximum)) == (
      np.int64, 0, 5)  # Pong's six actions.
  policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), action,
                                           seed=0)
  previous = env.reset()
  assert previous.is_first()
  array_spec.check_arrays_nest(previous.observation, spec)
  for _ in range(40):
    time_step = env.step(policy.action(previous).action)
    array_spec.check_arrays_nest(time_step.observation, spec)
    assert time_step.is_mid()  # A Pong game lasts far longer than 40 steps.
    # The stack slides by one frame, oldest first, newest last.
    np.testing.assert_array_equal(time_step.observation[:3],
                                  previous.observation[1:])
    previous = time_step
  # The screen changes over 40 agent steps (160 frames): real ALE frames.
  assert len({frame.tobytes() for frame in previous.observation}) > 1
  again = env.reset()
  assert again.is_first() and again.observation.shape == (4, 84, 84)
  env.close()


def test_stack_axis_minus_one_stacks_the_same_frames_last():
  first = atari_env.make_atari_env('Pong', seed=0)
  last = atari_env.make_atari_env('Pong', seed=0, stack_axis=-1)
  spec = last.observation_spec()
  assert (spec.shape, spec.dtype) == ((84, 84, 4), np.uint8)
  assert (spec.minimum.shape, int(spec.minimum), int(spec.maximum)) == (
      (), 0, 255)
  a, b = first.reset(), last.reset()
  for action in [0, 2, 3, 1, 2, 2, 3, 0, 1, 2]:
    array_spec.check_arrays_nest(b.observation, spec)
    assert b.observation.flags['C_CONTIGUOUS']
    np.testing.assert_array_equal(b.observation,
                                  np.moveaxis(a.observation, 0, -1))
    previous = b
    a, b = first.step(action), last.step(action)
    np.testing.assert_array_equal(b.observation[..., :3],
                                  previous.observation[..., 1:])
  first.close()
  last.close()


@pytest.mark.parametrize('axis', [1, 2, -2, None])
def test_other_stack_axes_are_refused(axis):
  with pytest.raises(ValueError, match=rf'stack_axis={axis!r}: .*first axis'):
    atari_env.make_atari_env('Pong', stack_axis=axis)


def test_the_seed_fixes_the_first_observation():
  first = factory.make_environment('atari:Breakout', seed=3).reset()
  again = factory.make_environment('atari:Breakout', seed=3).reset()
  np.testing.assert_array_equal(first.observation, again.observation)


@pytest.mark.parametrize('name, match', [
    ('atari:Pongg', r"unknown Atari game 'Pongg' in env 'atari:Pongg'\. Did "
     r"you mean 'Pong'\? Valid games .* e\.g\. Pong, Breakout"),
    ('atari:pong', r"unknown Atari game 'pong' .* Did you mean 'Pong'\?"),
    ('atari:', r"unknown Atari game '' in env 'atari:'\. Valid games"),
])
def test_bad_game_names_are_named_with_valid_ones(name, match):
  with pytest.raises(ValueError, match=match):
    factory.make_environment(name)


def test_without_ale_py_the_error_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, 'ale_py', None)  # import ale_py fails
  with pytest.raises(errors.MissingExtraError,
                     match=r"atari extra .* pip install -e '\.\[atari\]'.* "
                     "make install"):
    atari_env.make_atari_env('Pong')


def test_populate_a_pong_starter_buffer_end_to_end(tmp_path):
  result = subprocess.run(
      [CONSOLE_SCRIPT, '--env=atari:Pong', '--policy=random',
       '--buffer_name=pong', '--steps_per_run=150', '--num_runs=2',
       '--capacity=1000', f'--output_dir={tmp_path}', '--quiet'],
      capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-3000:]
  buffer_dir = tmp_path / 'pong_seq2_300steps'
  record = json.loads((buffer_dir / 'provenance.json').read_text())
  assert (record['env'], record['policy']) == ('atari:Pong', 'random')
  assert record['env_steps'] == 300 and record['complete']
  manager = smart_replay.ReplayBufferManager.from_checkpoint(str(buffer_dir))
  with manager:
    manager.load_replay_buffer()
    # Atari buffers store each frame once (the stack found by its shape).
    assert manager.buffer_config['layout']['frame_stack'] == {
        'field': 'observation', 'axis': 0, 'codec': 'zstd'}
    assert manager.num_frames() == record['items'] == 299
    trajectory, _ = next(iter(manager.get_dataset(batch_size=8)))
  assert trajectory.observation.shape == [8, 2, 4, 84, 84]
  assert trajectory.observation.dtype.name == 'uint8'
  observation = trajectory.observation.numpy()
  # Within an item the second step's stack continues the first one's.
  mid = trajectory.step_type.numpy()[:, 1] == 1
  np.testing.assert_array_equal(observation[mid, 1, :3],
                                observation[mid, 0, 1:])
