r"""A standalone buffer server, remote actors and a learner on one machine.

The layout of a distributed TF-Agents run, on one machine:

* `smart-replay-serve` serves the buffer (its own process; it checkpoints on
  a schedule and when stopped, and resumes its newest checkpoint on a
  restart);
* `--num_actors` actor processes (started with 'spawn': a Reverb client
  cannot cross a fork) each connect in client mode
  (`ReplayBufferManager(server_address=...)`, `connect()`) and write a
  random policy's CartPole steps with a TF-Agents Actor;
* this process is the learner: it connects too and trains DQN from
  `get_dataset`, then asks the server for a checkpoint.

Every client presents the server's control token, the file the server
created in its buffer directory (`<root_dir>/buffer/control.token`).

```bash
python examples/remote_actors.py --root_dir=/tmp/remote_cartpole
```

On several machines, run the server with the same flags (and
`--reverb_host=<its address> --control_host=<its address>`: both listen on
127.0.0.1 by default) on one of them, and give the others its address and a
copy of its token file (see docs/remote.md: "Security").
"""

import multiprocessing
import os
import signal
import subprocess
import sys

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.networks import q_network
from tf_agents.policies import random_py_policy
from tf_agents.train import actor
from tf_agents.train import learner
from tf_agents.train.utils import spec_utils
from tf_agents.train.utils import train_utils

import smart_replay
from smart_replay.apps.envs import gymnasium_env

flags.DEFINE_string('root_dir', None, 'Where the server keeps the buffer.')
flags.DEFINE_integer('num_actors', 2, 'Actor processes.')
flags.DEFINE_integer('steps_per_actor', 1000, 'Steps each actor writes.')
flags.DEFINE_integer('num_iterations', 500, 'Learner train steps.')
flags.DEFINE_integer('server_timeout_s', 120, 'How long to wait for the '
                     'server to start and to stop.')
flags.mark_flag_as_required('root_dir')
FLAGS = flags.FLAGS


def make_env(seed: int) -> gymnasium_env.GymnasiumEnv:
  return gymnasium_env.GymnasiumEnv('CartPole-v1', seed=seed)


def make_agent(env, train_step: tf.Variable) -> dqn_agent.DqnAgent:
  observation_spec, action_spec, time_step_spec = (
      spec_utils.get_tensor_specs(env))
  agent = dqn_agent.DqnAgent(
      time_step_spec, action_spec,
      q_network=q_network.QNetwork(observation_spec, action_spec),
      optimizer=tf.keras.optimizers.Adam(1e-3),
      train_step_counter=train_step)
  agent.initialize()
  return agent


def run_actor(server_address: str, token_file: str, seed: int,
              steps: int) -> None:
  """One actor process: connects to the server and writes `steps` steps."""
  env = make_env(seed)
  agent = make_agent(env, train_utils.create_train_step())
  with smart_replay.ReplayBufferManager(
      agent.collect_data_spec, server_address=server_address,
      control_token_file=token_file) as manager:
    _, observer = manager.connect()  # Checks the spec against the server.
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(),
                                             env.action_spec(), seed=seed)
    actor.Actor(env, policy, train_utils.create_train_step(),
                steps_per_run=steps, observers=[observer]).run()
    logging.info('Actor %d wrote %d steps.', seed, observer.num_steps)


def start_server(root_dir: str, data_spec, timeout_s: float):
  """Starts `smart-replay-serve`; returns the process, its address and its
  control token file."""
  spec_file = os.path.join(root_dir, 'spec.pbtxt')
  smart_replay.save_spec(spec_file, data_spec)
  port = smart_replay.free_port_pair()  # Port + 1: the control service's.
  server = subprocess.Popen(
      [sys.executable, '-m', 'smart_replay_scripts.serve',
       f'--spec_file={spec_file}',
       f'--checkpoint_dir={os.path.join(root_dir, "buffer")}',
       f'--port={port}', '--capacity=100000', '--sequence_length=2'],
      stdout=subprocess.PIPE, text=True)
  line = _read_line(server, timeout_s)
  if not line.startswith('Serving'):
    server.kill()
    raise RuntimeError(f'smart-replay-serve did not start: {line!r}')
  logging.info('%s', line.strip())
  return (server, f'localhost:{port}',
          os.path.join(root_dir, 'buffer', 'control.token'))


def _read_line(process: subprocess.Popen, timeout_s: float) -> str:
  """The process's first stdout line, or '' after `timeout_s`."""
  pool = multiprocessing.pool.ThreadPool(1)
  try:
    return pool.apply_async(process.stdout.readline).get(timeout_s)
  except multiprocessing.TimeoutError:
    return ''
  finally:
    pool.terminate()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.INFO)
  os.makedirs(FLAGS.root_dir, exist_ok=True)
  env = make_env(0)
  train_step = train_utils.create_train_step()
  agent = make_agent(env, train_step)
  server, address, token_file = start_server(
      FLAGS.root_dir, agent.collect_data_spec, FLAGS.server_timeout_s)
  try:
    context = multiprocessing.get_context('spawn')
    actors = [context.Process(target=run_actor,
                              args=(address, token_file, seed,
                                    FLAGS.steps_per_actor))
              for seed in range(1, FLAGS.num_actors + 1)]
    for process in actors:
      process.start()
    with smart_replay.ReplayBufferManager(
        agent.collect_data_spec, server_address=address,
        control_token_file=token_file) as manager:
      manager.connect()
      dqn_learner = learner.Learner(
          os.path.join(FLAGS.root_dir, 'train'), train_step, agent,
          lambda: manager.get_dataset(batch_size=64, num_steps=2))
      dqn_learner.run(iterations=FLAGS.num_iterations)
      for process in actors:
        process.join(FLAGS.server_timeout_s)
      failed = [p.exitcode for p in actors if p.exitcode != 0]
      if failed:
        raise RuntimeError(f'actor processes failed: exit codes {failed}')
      path = manager.checkpoint(extra={'train_step': int(train_step.numpy())})
      logging.info('Trained %d steps; the server holds %d items and '
                   'checkpointed to %s.', int(train_step.numpy()),
                   manager.num_frames(), path)
  finally:
    server.send_signal(signal.SIGTERM)  # A final checkpoint, then exit 0.
    server.wait(FLAGS.server_timeout_s)


if __name__ == '__main__':
  app.run(main)
