"""Which servers answer, and which were restarted: one record per server.

A client of standalone servers (one, or every shard of a sharded buffer)
asks each server's control service which instance serves (`ReplayServer`
gives each start an id). `Instances` keeps what the last answers were and
turns a round of answers into changes: a server that stopped answering
('down'), one that answers again as the same instance ('up': the connection
was interrupted only) or as another ('restarted': its Reverb streams must be
started again, and writers count what the restart lost).
"""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

from absl import logging

DOWN, UP, RESTARTED = 'down', 'up', 'restarted'


@dataclasses.dataclass(frozen=True)
class Change:
  """A server's change between two rounds.

  Attributes:
    server: its index (the shard).
    kind: `DOWN`, `UP` (the same instance answers again) or `RESTARTED` (a
      new instance answers).
    instance: the instance that answers (None when down).
  """
  server: int
  kind: str
  instance: Optional[Dict[str, Any]] = None


class Instances:
  """The last answer of each server, and the changes of each round.

  Args:
    addresses: each server's address (for messages and `states`).
    first: each server's instance when the client connected.
  """

  def __init__(self, addresses: Sequence[str],
               first: Sequence[Optional[Dict[str, Any]]]):
    self._addresses = list(addresses)
    self._ids = [(i or {}).get('id') for i in first]
    self._up = [i is not None for i in first]
    self._down_events = [0] * len(addresses)

  def update(self, answers: Sequence[Optional[Dict[str, Any]]]
             ) -> List[Change]:
    """Takes one round of answers.

    Args:
      answers: per server, the instance that answered, or None.

    Returns:
      What changed, server by server (a restart seen without a 'down' in
      between counts as a down event too).
    """
    changes = []
    sharded = len(self._addresses) > 1
    for k, answer in enumerate(answers):
      name = (f'Shard {k} ({self._addresses[k]})' if sharded else
              f'The server {self._addresses[k]}')
      if answer is None:
        if self._up[k]:
          self._up[k] = False
          self._down_events[k] += 1
          logging.warning('%s does not answer%s (down %d time(s) so far).',
                          name, ': sampling goes on from the other shards '
                          'without it' if sharded else '',
                          self._down_events[k])
          changes.append(Change(k, DOWN))
        continue
      restarted = answer.get('id') != self._ids[k]
      if self._up[k] and not restarted:
        continue
      if self._up[k]:
        self._down_events[k] += 1
      logging.warning('%s is serving again%s%s.', name,
                      ' (a new instance: it restarted)' if restarted else '',
                      '; its samples are drawn again' if sharded else '')
      self._ids[k], self._up[k] = answer.get('id'), True
      changes.append(Change(k, RESTARTED if restarted else UP, answer))
    return changes

  def states(self) -> List[Dict[str, Any]]:
    """Per server: `{'address', 'up', 'down_events'}`."""
    return [{'address': a, 'up': u, 'down_events': d}
            for a, u, d in zip(self._addresses, self._up, self._down_events)]

