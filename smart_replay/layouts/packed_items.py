"""Packed items: blocks of consecutive packed steps, one Reverb item each.

A table with `TableConfig.block_length = K` and `sequence_length = L` stores
each environment's stream as blocks of up to K packed rows (see
`packed_steps.StepCodec`), each written as ONE Reverb step of `uint8[K,
bytes]` and one item: Reverb's fixed cost is paid once per block instead of
once per window. A new block starts every `S = K - L + 1` steps, its first
L - 1 rows repeating the end of the previous one, so every window of L steps
lies in exactly one block. A block's priority is the number of windows it
holds (S, fewer in the last block of an episode, whose missing rows are
zeros), and the table samples blocks in proportion to it (prioritized,
exponent 1): the sampled window, cut uniformly from its block, is uniform
over all stored windows.

Both directions live here: `BlockBuilder` makes the blocks (the writer,
`writing.block_writer`, sends them), `cut_windows` and `cut_blob_windows`
cut sampled blocks back into windows inside `tf.data`, and `window_items`
lists every stored window for readers. With a frame-stacked layout
(`frame_stacks.FrameStackedLayout`) a block is ONE blob of its cells
(`frame_cells.encode_block`: its first cell a whole stack, then each step's
new frames), compressed in groups of 8 cells with zstd (one group with
zlib), so the codec sees across a group's frames; `cut_blob_batches` cuts a
batch of zstd blocks, inflating only the groups each window needs, and
`cut_blob_windows` one zlib block.

A block is complete once it is full, at the end of an episode (unless the
table crosses episodes) and on a flush (so a checkpoint holds every window
written; the next block then repeats the last L - 1 rows).
"""

from typing import Any, Callable, List, Sequence, Tuple

import numpy as np
import reverb
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

# The step types that end an episode's block.
FIRST, LAST = int(ts.StepType.FIRST), int(ts.StepType.LAST)

Block = Tuple[np.ndarray, int]  # (rows [K, bytes], windows it holds)


class BlockBuilder:
  """The open block of one table for one environment's stream (pure numpy).

  Args:
    config: the table's resolved `TableConfig` (with `block_length`).
    bytes_per_step: the length of a packed row.
  """

  def __init__(self, config: Any, bytes_per_step: int):
    self.table = config.name
    self._length = config.sequence_length
    self._cross = config.cross_episodes
    self._rows = np.zeros([config.block_length, bytes_per_step], np.uint8)
    self._count = 0  # Rows in the open block.

  def add(self, row: np.ndarray, step_type: int) -> List[Block]:
    """Adds one packed step; returns the blocks it completes.

    Args:
      row: the step's packed row.
      step_type: its step type (FIRST ends the episode before it, LAST after
        it, unless the table crosses episodes).

    Returns:
      `(rows, windows)` of each completed block (a copy), oldest first.
    """
    done = []
    if step_type == FIRST and not self._cross and self._count:
      done += self._cut(keep=False)
    self._rows[self._count] = row
    self._count += 1
    if self._count == len(self._rows):
      done += self._cut(keep=True)
    if step_type == LAST and not self._cross:
      done += self._cut(keep=False)
    return done

  def end_episode(self) -> List[Block]:
    """Ends the stream's episode: the open block is complete (unless the
    table crosses episodes)."""
    return [] if self._cross else self._cut(keep=False)

  def flush(self) -> List[Block]:
    """Completes the open block, so every window written is stored; the next
    block repeats the last `sequence_length - 1` rows."""
    return self._cut(keep=True)

  def reset(self) -> None:
    """Forgets the open block (the stream starts over)."""
    self._count = 0

  def _cut(self, *, keep: bool) -> List[Block]:
    count, overlap = self._count, self._length - 1
    windows = count - overlap
    if windows <= 0:  # No whole window (yet): nothing to store.
      if not keep:
        self._count = 0
      return []
    block = self._rows.copy()
    block[count:] = 0
    if keep:  # The rows the next window needs.
      self._rows[:overlap] = self._rows[count - overlap:count]
      self._count = overlap
    else:
      self._count = 0
    return [(block, windows)]


def _starts(count: tf.Tensor, windows_per_item: int) -> tf.Tensor:
  """`windows_per_item` window starts uniform in `[0, count)` per block.

  Args:
    count: int64 windows of each block, any shape (its priority).
    windows_per_item: starts per block.

  Returns:
    int32 `[*count.shape, windows_per_item]`: 62 random bits modulo count
    (bias < 2**-56).
  """
  bits = tf.random.uniform(tf.concat([tf.shape(count), [windows_per_item]], 0),
                           maxval=2**62, dtype=tf.int64)
  return tf.cast(bits % count[..., None], tf.int32)


def _windows_info(info: Any, windows_per_item: int) -> Any:
  """Sampled blocks' info `[blocks]` as their windows' `[blocks *
  windows_per_item]`, block by block: the probability of one window (the
  block's over the windows it holds, its priority)."""
  info = info._replace(probability=info.probability /
                       tf.cast(info.priority, tf.float64))
  return tf.nest.map_structure(lambda t: tf.repeat(t, windows_per_item), info)


def cut_windows(length: int, windows_per_item: int
                ) -> Callable[[reverb.ReplaySample], reverb.ReplaySample]:
  """A `tf.data` map from a batch of sampled blocks to their windows.

  Each block gives `windows_per_item` windows, each starting uniformly at
  random among the block's windows (its priority), independently; a
  window's probability is its block's divided by that count, which is the
  same for every stored window. The work is one gather per batch, so
  sampling costs about what sampling whole blocks costs.

  Args:
    length: steps per window (the table's `sequence_length`).
    windows_per_item: windows cut from each block.

  Returns:
    `fn(sample) -> sample`: data `[blocks, 1, block_length, bytes]` to
    `[blocks * windows_per_item, length, bytes]`, info `[blocks]` to
    `[blocks * windows_per_item]`.
  """
  def cut(sample: reverb.ReplaySample) -> reverb.ReplaySample:
    blocks = sample.data[:, 0]  # [blocks, block_length, bytes]
    starts = _starts(tf.cast(sample.info.priority, tf.int64), windows_per_item)
    steps = starts[..., None] + tf.range(length)  # [blocks, windows, length]
    windows = tf.gather(blocks, steps, batch_dims=1)
    rows = -1 if blocks.shape[0] is None else blocks.shape[0] * (
        windows_per_item)  # Static when whole batches of blocks are taken.
    data = tf.reshape(windows, [rows, length, blocks.shape[-1]])
    return reverb.ReplaySample(
        info=_windows_info(sample.info, windows_per_item), data=data)
  return cut


def cut_blob_windows(length: int, windows_per_item: int, block_length: int,
                     cut_block: Callable[..., Any]
                     ) -> Callable[[reverb.ReplaySample], reverb.ReplaySample]:
  """A `tf.data` map from one sampled block blob to its windows.

  For blocks of a frame-stacked layout (one blob each): the windows are
  uniform among the block's, as in `cut_windows`; map before batching, then
  `unbatch()`.

  Args:
    length: steps per window.
    windows_per_item: windows cut from each block.
    block_length: cells per block.
    cut_block: the layout's `cut_block(blob, block_length, starts, length)`.

  Returns:
    `fn(sample) -> sample`: data `[1]` (a blob) to `(rows, stacks)` of
    `[windows_per_item, length, ...]`, info to `[windows_per_item]`.
  """
  def cut(sample: reverb.ReplaySample) -> reverb.ReplaySample:
    starts = _starts(tf.cast(sample.info.priority, tf.int64),
                     windows_per_item)
    data = cut_block(sample.data[0], block_length, starts, length)
    return reverb.ReplaySample(
        info=_windows_info(tf.nest.map_structure(lambda t: t[None],
                                                 sample.info),
                           windows_per_item), data=data)
  return cut


def cut_blob_batches(length: int, windows_per_item: int, block_length: int,
                     cut_blocks: Callable[..., Any]
                     ) -> Callable[[reverb.ReplaySample], reverb.ReplaySample]:
  """A `tf.data` map from a batch of sampled block blobs to their windows.

  For zstd blocks of a frame-stacked layout: the windows are uniform among
  each block's, as in `cut_windows`; map after batching.

  Args:
    length: steps per window.
    windows_per_item: windows cut from each block.
    block_length: cells per block.
    cut_blocks: the layout's `cut_blocks(blobs, block_length, starts,
      length)`.

  Returns:
    `fn(sample) -> sample`: data `[blocks, 1]` (blobs) to `(rows, stacks)`
    of `[blocks * windows_per_item, length, ...]`, info `[blocks]` to
    `[blocks * windows_per_item]`.
  """
  def cut(sample: reverb.ReplaySample) -> reverb.ReplaySample:
    starts = _starts(tf.cast(sample.info.priority, tf.int64),
                     windows_per_item)
    data = cut_blocks(sample.data[:, 0], block_length, starts, length)
    return reverb.ReplaySample(
        info=_windows_info(sample.info, windows_per_item), data=data)
  return cut


def window_items(items: Sequence[Any], length: int) -> List[Any]:
  """Every window of every stored block, as items of their own.

  Args:
    items: `CheckpointReader` items of a table of packed items, decoded
      (each field `[1, block_length, ...]`; the priority is the block's
      window count).
    length: steps per window.

  Returns:
    One item per window, in block order, with fields `[length, ...]` and
    the key, priority and times sampled of its block (`steps` empty).
  """
  windows = []
  for item in items:
    for start in range(int(round(item.priority))):
      windows.append(item._replace(
          columns=[c[0, start:start + length] for c in item.columns],
          steps=[]))
  return windows
