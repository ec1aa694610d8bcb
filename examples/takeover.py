r"""Taking over a replay buffer written with plain TF-Agents and Reverb.

The first half is the buffer of TF-Agents' own examples, unchanged: a
`reverb.Table`, a `reverb.Server` with a `DefaultCheckpointer`, TF-Agents'
`ReverbReplayBuffer` and `ReverbAddTrajectoryObserver`, filled by an Actor
and saved with `py_client.checkpoint()`. The second half imports that
checkpoint into a smart_replay buffer
(`smart_replay.import_reverb_checkpoint`; the CLI is `smart-replay-import`),
which checks the agent's spec against the stored data, and continues it with
`ReplayBufferManager`: new steps, sampling and verified checkpoints. The
plain checkpoint is only read.

```bash
python examples/takeover.py --root_dir=/tmp/takeover
```
"""

import os

from absl import app
from absl import flags
from absl import logging
import reverb
from tf_agents.policies import random_py_policy
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.replay_buffers import reverb_utils
from tf_agents.specs import tensor_spec
from tf_agents.train import actor
from tf_agents.train.utils import spec_utils
from tf_agents.train.utils import train_utils
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import trajectory

import smart_replay
from smart_replay.apps.envs import gymnasium_env

flags.DEFINE_string('root_dir', None, 'Where both buffers go.')
flags.DEFINE_integer('steps', 1000, 'Steps the plain buffer gets.')
flags.mark_flag_as_required('root_dir')
FLAGS = flags.FLAGS
TABLE = 'uniform_table'


def write_plain_buffer(plain_dir: str, env, data_spec, steps: int) -> None:
  """TF-Agents' own Reverb buffer, filled by a random policy and saved."""
  table = reverb.Table(
      TABLE, max_size=100_000, sampler=reverb.selectors.Uniform(),
      remover=reverb.selectors.Fifo(),
      rate_limiter=reverb.rate_limiters.MinSize(1),
      signature=tensor_spec.add_outer_dim(data_spec, 2))
  server = reverb.Server(
      [table], checkpointer=reverb.checkpointers.DefaultCheckpointer(
          path=plain_dir))
  replay_buffer = reverb_replay_buffer.ReverbReplayBuffer(
      data_spec, sequence_length=2, table_name=TABLE,
      local_server=server)
  observer = reverb_utils.ReverbAddTrajectoryObserver(
      replay_buffer.py_client, TABLE, sequence_length=2, stride_length=1)
  actor.Actor(env, random_py_policy.RandomPyPolicy(
      env.time_step_spec(), env.action_spec()),
              train_utils.create_train_step(), steps_per_run=steps,
              observers=[observer]).run()
  observer.close()
  logging.info('Plain Reverb checkpoint: %s',
               replay_buffer.py_client.checkpoint())
  server.stop()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.INFO)
  env = gymnasium_env.GymnasiumEnv('CartPole-v1', seed=0)
  _, action_spec, time_step_spec = spec_utils.get_tensor_specs(env)
  data_spec = trajectory.from_transition(
      time_step_spec, policy_step.PolicyStep(action_spec), time_step_spec)
  plain_dir = os.path.join(FLAGS.root_dir, 'plain')
  write_plain_buffer(plain_dir, env, data_spec, FLAGS.steps)

  buffer_dir = os.path.join(FLAGS.root_dir, 'buffer')
  smart_replay.import_reverb_checkpoint(plain_dir, buffer_dir,
                                        data_spec=data_spec)  # Logs what it did.
  manager = smart_replay.ReplayBufferManager.from_checkpoint(buffer_dir)
  _, observer = manager.load_replay_buffer()
  actor.Actor(env, random_py_policy.RandomPyPolicy(
      env.time_step_spec(), env.action_spec()),
              train_utils.create_train_step(), steps_per_run=100,
              observers=[observer]).run()
  experience, info = next(iter(manager.get_dataset(batch_size=32,
                                                   num_steps=2)))
  logging.info('Sampled a batch of observations %s (keys %s...); the buffer '
               'holds %d items; checkpoint %s.', experience.observation.shape,
               info.key.numpy()[:3, 0], manager.num_frames(),
               manager.checkpoint())
  manager.close()


if __name__ == '__main__':
  app.run(main)
