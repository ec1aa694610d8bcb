"""Checkpoints clients ask for: coalesced, and spaced in time."""

import concurrent.futures
import threading
import time

import pytest

from smart_replay.remote import requests
from smart_replay.storage import coordinated_records


@pytest.mark.unit
def test_spacing_starts_each_at_least_the_interval_after_the_last_ended():
  spacing = requests.Spacing(0.2)
  spans = []
  for _ in range(3):
    with spacing.spaced():
      began = time.monotonic()
      time.sleep(0.01)
      spans.append((began, time.monotonic()))
  for (_, ended), (began, _) in zip(spans, spans[1:]):
    assert began - ended >= 0.2 - 1e-3
  with pytest.raises(ValueError, match='min_interval_s must be a number >= '
                     '0, got -1'):
    requests.Spacing(-1)


@pytest.mark.unit
def test_a_flood_of_distinct_requests_saves_at_most_once_per_interval():
  """The review's C1: requests with distinct `extra`s (so nothing
  coalesces) from 4 threads: each gets its own checkpoint, and saves start
  at least the interval apart."""
  starts, saving = [], threading.Lock()

  def save(extra):
    starts.append(time.monotonic())
    assert extra[coordinated_records.REQUESTED_KEY] is True
    return f"ckpt-{extra['n']}"

  asked = requests.CheckpointRequests(save, saving,
                                      spacing=requests.Spacing(0.05))
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    paths = list(pool.map(lambda n: asked.request({'n': n}), range(12)))
  assert paths == [f'ckpt-{n}' for n in range(12)]
  gaps = [b - a for a, b in zip(starts, starts[1:])]
  assert min(gaps) >= 0.05 - 1e-3, gaps
