"""Compiled TensorFlow ops of smart_replay, built from C++ in this folder.

* `zstd`: zstd compression of string tensors in the graph
  (`SmartReplayZstdEncode`, `SmartReplayZstdDecode`), loaded from
  `_zstd_ops.so`;
* `stacks`: frame stacks gathered in the graph from decoded frames, on
  either stack axis (`SmartReplayGatherStacks`, `stack_ops.cc`, in the same
  library), and split back into frames for the writers;
* `build`: compiles that library, with zstd itself, into a per-user cache
  the first time a process needs it (`python -m smart_replay.ops.build`,
  which `make ops` runs, does it ahead of time; needs only a C++ compiler);
* `zstd_source`: zstd's C source, from the pinned `zstandard` source
  distribution, fetched with pip;
* `bind_address`: not an op: an `LD_PRELOAD` library (`bind_address.c`,
  built the same way into the same cache, in well under a second) that
  makes a process started with it bind Reverb's port to one address, which
  `smart-replay-serve --reverb_host` restarts itself with.

Nothing is imported here: importing `smart_replay.ops.zstd` does not load the
library, its first use does.
"""
