"""Ports chosen outside the ephemeral range, in free pairs."""

import random
import socket

import pytest

from smart_replay.utils import ports


@pytest.mark.unit
def test_pairs_are_free_and_outside_the_ephemeral_range():
  low, high = ports.ephemeral_range()
  assert 0 < low <= high < 65536
  rng = random.Random(0)
  for _ in range(20):
    port = ports.free_port_pair(rng=rng)
    assert not low <= port <= high and not low <= port + 1 <= high
    assert ports.is_free(port) and ports.is_free(port + 1)


@pytest.mark.unit
def test_a_taken_neighbour_is_skipped():
  first = ports.free_port_pair(rng=random.Random(7))
  with socket.socket() as squatter:
    squatter.bind(('127.0.0.1', first + 1))
    assert not ports.is_free(first + 1)
    assert ports.free_port_pair(rng=random.Random(7)) != first
  assert not ports.is_free(0) and not ports.is_free(65536)


@pytest.mark.unit
def test_no_free_pair_is_an_error(monkeypatch):
  monkeypatch.setattr(ports, 'is_free', lambda port: False)
  with pytest.raises(OSError, match='no two free consecutive TCP ports found '
                                    'in 5 tries outside the ephemeral range'):
    ports.free_port_pair(attempts=5)
