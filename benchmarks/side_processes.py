"""The processes the low-dimensional benchmark's servers run in.

Each buffer's Reverb server runs in its own process, so its memory is its
own. Spawning one costs an import of TensorFlow, Reverb, TF-Agents and
smart_replay (about 5 s of CPU each); instead, servers fork from one server
process that imported them once and made no thread, client or server of
theirs. A server forked from the parent itself would hang on the parent's
gRPC state, so it is never forked from there.

What a server measures is unchanged: its memory as growth over its own
start, its restore time from its own start. The Atari benchmark's sides
still spawn: their memory slope is measured over a few thousand steps, where
a heap inherited from the fork server could hide a page or two.
"""

import multiprocessing
from multiprocessing import context as context_lib

# Modules the servers import; loading them is all the fork server does.
PRELOADED = ('smart_replay_benchmarks.workload',
             'smart_replay_benchmarks.sampling')


def context() -> context_lib.BaseContext:
  """The multiprocessing context to start a benchmark server with.

  Returns:
    The 'forkserver' context, its server preloading `PRELOADED`.
  """
  forkserver = multiprocessing.get_context('forkserver')
  forkserver.set_forkserver_preload(list(PRELOADED))
  return forkserver
