"""The processes benchmark sides run in.

Each side (a Reverb server of the low-dimensional benchmark, an Atari side)
runs in its own process, so its memory is its own. Spawning one costs an
import of TensorFlow, Reverb, TF-Agents and smart_replay (about 5 s of CPU
each); instead, sides fork from one server process that imported them once
and made no thread, client or server of theirs. A side forked from the
parent itself would hang on the parent's gRPC state, so it is never forked
from there.

What a side measures is unchanged: memory is read as growth over the side's
own start, and restore times from the side's own start.
"""

import multiprocessing
from multiprocessing import context as context_lib

# Modules the sides import; loading them is all the server process does.
PRELOADED = ('smart_replay_benchmarks.workload',
             'smart_replay_benchmarks.sampling',
             'smart_replay_benchmarks.atari_sides')


def context() -> context_lib.BaseContext:
  """The multiprocessing context to start a benchmark side with.

  Returns:
    The 'forkserver' context, its server preloading `PRELOADED`.
  """
  forkserver = multiprocessing.get_context('forkserver')
  forkserver.set_forkserver_preload(list(PRELOADED))
  return forkserver
