"""Compiled TensorFlow ops of smart_replay, built from C++ in this folder.

* `zstd`: zstd compression of string tensors in the graph
  (`SmartReplayZstdEncode`, `SmartReplayZstdDecode`), loaded from
  `_zstd_ops.so`;
* `build`: compiles that library (`python -m smart_replay.ops.build`, which
  `make ops` runs; needs g++ and `apt-get install libzstd-dev`).

Nothing is imported here: importing `smart_replay.ops.zstd` does not load the
library, its first use does.
"""
