"""The windows a server lacks are packed into new blocks, each window once."""

import collections
import types

import numpy as np
import pytest

from smart_replay.writing import block_resending

FIRST, MID, LAST = 0, 1, 2


def _config(length, block_length=6, cross=False):
  return types.SimpleNamespace(name='t', sequence_length=length,
                               block_length=block_length,
                               cross_episodes=cross)


def _stream(episodes):
  """`(row, step_type)` of episodes of the given lengths; row i holds i+1."""
  rows, number = [], 0
  for size in episodes:
    for index in range(size):
      number += 1
      kind = FIRST if index == 0 else LAST if index == size - 1 else MID
      rows.append((np.full([2], number, np.uint8), kind))
  return rows


def _windows(rows, length, cross=False):
  """The last row's number of every window the writer made."""
  ends, run = [], 0
  for row, kind in rows:
    if kind == FIRST and not cross:
      run = 0
    run += 1
    if run >= length:
      ends.append(int(row[0]))
    if kind == LAST and not cross:
      run = 0
  return ends


def _made(blocks, length):
  """The last row's number of every window of `blocks`."""
  ends = []
  for block, windows in blocks:
    ends += [int(block[start + length - 1][0]) for start in range(windows)]
  return ends


@pytest.mark.parametrize('length,cross', [(2, False), (3, False), (3, True),
                                          (1, False)])
def test_exactly_the_missing_windows_are_made(length, cross):
  rows = _stream([5, 9, 2, 14, 7])
  every = _windows(rows, length, cross)
  rng = np.random.default_rng(length)
  held = {end for end in every if rng.random() < 0.5}
  gaps = block_resending._Gaps(_config(length, cross=cross), 2, fresh=True)
  blocks = []
  for row, kind in rows:
    blocks += gaps.add(row, kind, missing=int(row[0]) not in held)
  blocks += gaps.finish()
  made = _made(blocks, length)
  assert collections.Counter(made) == collections.Counter(
      end for end in every if end not in held)
  assert gaps.lost == 0
  for block, windows in blocks:  # Cut as the writer cuts: full at 6 rows.
    assert 1 <= windows <= 6 - length + 1
    assert not block[windows + length - 1:].any()  # Unused rows are zero.


def test_a_window_whose_rows_are_gone_is_counted_lost():
  # Kept calls that begin mid-episode: the first row ends a window whose
  # earlier rows are not kept.
  rows = _stream([12])[4:]
  gaps = block_resending._Gaps(_config(3), 2, fresh=False)
  blocks = []
  for row, kind in rows:
    blocks += gaps.add(row, kind, missing=True)
  blocks += gaps.finish()
  assert gaps.lost == 2  # Rows 5 and 6 end windows that need rows 3 and 4.
  assert _made(blocks, 3) == list(range(7, 13))


def test_an_end_of_episode_stops_a_run():
  rows = _stream([4, 4])
  gaps = block_resending._Gaps(_config(2), 2, fresh=True)
  blocks = []
  for row, kind in rows[:2]:
    blocks += gaps.add(row, kind, missing=True)
  blocks += gaps.end_episode()  # The observer's end_episode().
  for row, kind in rows[2:]:
    blocks += gaps.add(row, MID, missing=True)
  blocks += gaps.finish()
  assert _made(blocks, 2) == [2, 4, 5, 6, 7, 8]
