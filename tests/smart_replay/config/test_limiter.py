"""Tests for smart_replay.config.limiter (no Reverb server)."""

import math

import pytest

from smart_replay.config import limiter
from smart_replay.config import tables

pytestmark = pytest.mark.unit

EMPTY = {'inserts': 0, 'samples': 0, 'items': 0}


def _resolved(**kwargs):
  return tables.TableConfig(**kwargs).resolve(capacity=100, sequence_length=2,
                                              stride_length=1)


def test_inserts_before_blocking():
  assert limiter.inserts_before_blocking(_resolved()) == math.inf
  ratio = _resolved(samples_per_insert=2.0, error_buffer=10.0,
                    min_size_to_sample=5)
  # max_diff = 2 * 5 + 10 = 20: 10 inserts with nothing sampling.
  assert limiter.inserts_before_blocking(ratio) == 10
  assert limiter.inserts_before_blocking(ratio, inserts=4, size=4) == 6
  assert limiter.inserts_before_blocking(ratio, inserts=10, samples=4,
                                         size=10) == 2
  queue = _resolved(sampler='fifo', max_times_sampled=1, max_size=8,
                    block_inserts_when_full=True)
  assert limiter.inserts_before_blocking(queue, inserts=5, samples=1) == 4
  # The TableConfig method is the same function.
  assert ratio.inserts_before_blocking(inserts=4, size=4) == 6


def test_max_items():
  sequence = _resolved(sequence_length=3, stride_length=2)
  assert limiter.max_items(sequence, 10, 1) == 5
  assert limiter.max_items(sequence, 10, 3) == 7  # Each stream rounds up.
  episode = _resolved(kind='episode', episode_length=4)
  assert limiter.max_items(episode, 10, 2) == 10


def test_limiter_type():
  assert limiter.limiter_type(_resolved()) == 'min_size'
  assert limiter.limiter_type(_resolved(samples_per_insert=1.0,
                                        error_buffer=2.0)) == \
      'samples_per_insert'


def test_prefill_problems_name_the_table_and_the_fix():
  ratio = _resolved(name='ratio', samples_per_insert=1.0, error_buffer=2.0)
  assert limiter.prefill_problems([_resolved()], {'experience': EMPTY},
                                  steps=10**6, streams=1) == []
  problems = limiter.prefill_problems([_resolved(), ratio],
                                      {'experience': EMPTY, 'ratio': EMPTY},
                                      steps=50, streams=1)
  assert len(problems) == 1
  assert problems[0].startswith("table 'ratio': up to 50 new items")
  assert 'samples_per_insert rate limiter lets only 3 in' in problems[0]
  assert 'raise error_buffer to >= 49' in problems[0]
  assert 'min_size_to_sample >= 48' in problems[0]


def test_prefill_problem_of_a_queue_suggests_not_blocking():
  queue = _resolved(name='q', sampler='fifo', max_times_sampled=1, max_size=8,
                    block_inserts_when_full=True)
  problems = limiter.prefill_problems([queue], {'q': EMPTY}, steps=20,
                                      streams=1)
  assert 'queue rate limiter lets only 8 in' in problems[0]
  assert 'block_inserts_when_full=False' in problems[0]
  assert 'max_size >= 20' in problems[0]


@pytest.mark.parametrize('steps', [1, 7, 100])
def test_no_problem_when_the_limiter_allows_it(steps):
  queue = _resolved(name='q', sampler='fifo', max_times_sampled=1,
                    max_size=100, block_inserts_when_full=True)
  assert limiter.prefill_problems([queue], {'q': EMPTY}, steps=steps,
                                  streams=1) == []
