"""Memory soak: does RSS stay flat while a buffer is written, sampled and saved?

Runs `smart_replay_benchmarks.soak_lib.run` with the flags' settings (see
that module for what runs and what is fitted), prints the verdict, and exits
1 if the RSS slope after the warm-up exceeds --max_growth_mb_per_min.

Usage:
  MALLOC_ARENA_MAX=2 python scripts/soak.py           # what `make soak` runs
  python scripts/soak.py --mode=sample --sampler=stock --loop=eager
  python scripts/soak.py --duration_s=480 --output_json=soak.json
"""

import dataclasses
import json
import os
import sys

from absl import app
from absl import flags
from absl import logging

from smart_replay_benchmarks import soak_lib

_DEFAULT = soak_lib.Settings()

FLAGS = flags.FLAGS
flags.DEFINE_float('duration_s', _DEFAULT.duration_s, 'Seconds measured '
                   '(after the prefill and the warm-up).', lower_bound=1.0)
flags.DEFINE_float('warmup_s', _DEFAULT.warmup_s, 'Seconds run first and '
                   'left out of the fit: thread pools, prefetch buffers and '
                   'malloc arenas fill up during the first checkpoints.',
                   lower_bound=0.0)
flags.DEFINE_list('mode', sorted(_DEFAULT.mode),
                  'What runs: any of checkpoint, sample, write.')
flags.DEFINE_enum('sampler', _DEFAULT.sampler, soak_lib.SAMPLERS,
                  'ours: manager.get_dataset; stock: TF-Agents '
                  'ReverbReplayBuffer.as_dataset; reverb: a bare batched '
                  'reverb.TrajectoryDataset.')
flags.DEFINE_enum('loop', _DEFAULT.loop, soak_lib.LOOPS,
                  'function: take batches inside a tf.function (as '
                  'tf_agents.train.Learner does); eager: next(iterator) from '
                  'Python, which leaks ~45 bytes per tensor of every batch '
                  'with TF 2.15 on Python 3.11 (tensorflow#62551).')
flags.DEFINE_integer('batches_per_call', _DEFAULT.batches_per_call,
                     'Batches per tf.function call (--loop=function), like '
                     'Learner.run(iterations=N).', lower_bound=1)
flags.DEFINE_integer('batch_size', _DEFAULT.batch_size, 'Items per batch.',
                     lower_bound=1)
flags.DEFINE_float('write_steps_per_s', _DEFAULT.write_steps_per_s,
                   'Observer write rate.', lower_bound=1.0)
flags.DEFINE_integer('capacity', _DEFAULT.capacity, 'Items the table holds '
                     '(filled before the clock starts).', lower_bound=1)
flags.DEFINE_integer('observation_size', _DEFAULT.observation_size,
                     'Floats per observation.', lower_bound=1)
flags.DEFINE_float('checkpoint_every_s', _DEFAULT.checkpoint_every_s,
                   'Seconds between checkpoints.', lower_bound=0.1)
flags.DEFINE_enum('checkpoint_with', _DEFAULT.checkpoint_with,
                  soak_lib.CHECKPOINT_WITH,
                  'manager: manager.checkpoint(); reverb: the bare Reverb '
                  'Client.checkpoint(), to tell the two apart.')
flags.DEFINE_float('malloc_trim_every_s', _DEFAULT.malloc_trim_every_s,
                   'Diagnostic: call glibc malloc_trim(0) this often '
                   '(0: never).', lower_bound=0.0)
flags.DEFINE_float('rss_every_s', _DEFAULT.rss_every_s, 'Seconds between RSS '
                   'readings.', lower_bound=0.1)
flags.DEFINE_float('max_growth_mb_per_min', _DEFAULT.max_growth_mb_per_min,
                   'Pass bound on the fitted RSS slope after the warm-up.')
flags.DEFINE_string('output_json', None, 'Also write the settings, readings '
                    'and result here.')

def main(argv):
  """Runs the soak with the flags, prints the verdict; exits 1 on FAIL.

  Args:
    argv: leftover command-line arguments (none are accepted).
  """
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  names = [f.name for f in dataclasses.fields(soak_lib.Settings)]
  try:
    settings = soak_lib.Settings(**{name: FLAGS[name].value for name in names})
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  try:
    result = soak_lib.run(settings)
  except KeyboardInterrupt:  # run() has closed the buffer and removed it.
    print('\nInterrupted: no verdict (the slope needs the whole duration).',
          file=sys.stderr)
    sys.exit(130)
  print('\n' + soak_lib.summary(result))
  if FLAGS.output_json:
    with open(FLAGS.output_json, 'w') as f:
      json.dump(result, f, indent=1)
  if not result['passed']:
    sys.exit(1)


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
