"""What every stream of one observer shares: `WriterSettings`."""

import dataclasses
import threading
from typing import Callable, Dict, List, Optional

import reverb

from smart_replay.layouts import packed_steps
from smart_replay.layouts import protocol
from smart_replay.writing import confirmations as confirmations_lib
from smart_replay.writing import counters as counters_lib


@dataclasses.dataclass(frozen=True, eq=False)
class WriterSettings:
  """What every stream of one observer shares.

  Attributes:
    client: the `reverb.Client` of the server.
    chunk_length: steps per chunk of every column.
    keep_alive: steps whose cell references a stream keeps.
    timeout_ms: the bound of one wait on the server.
    reconnect_timeout_s: how long a wait goes on while the server does not
      answer.
    clear_at_episode_end: whether an episode end drops the cached steps (no
      table crosses episodes).
    signatures: `specs.describe_signature` of every table's signature, to
      check a server that came back.
    counters: where lost steps and items and reconnects are counted.
    confirmations: where confirmations are recorded.
    reconnected: set after the server came back while a write waited (the
      manager's watcher then checks whether it was restarted), or None.
    num_columns: Reverb columns of a step.
    encoder: makes a stream's `protocol.StepEncoder` (the layout's
      `encoder`: each step as it is, or a frame stack's cells).
    lookback: Reverb steps an item references before its first step (the
      layout's).
  """
  client: reverb.Client
  chunk_length: int
  keep_alive: int
  timeout_ms: int
  reconnect_timeout_s: float
  clear_at_episode_end: bool
  signatures: Dict[str, Optional[List[str]]]
  counters: counters_lib.Counters
  confirmations: confirmations_lib.ConfirmationLog
  reconnected: Optional[threading.Event]
  num_columns: int
  encoder: Callable[[], protocol.StepEncoder] = packed_steps.WholeSteps
  lookback: int = 0

  @property
  def table_names(self) -> List[str]:
    """The tables written."""
    return list(self.signatures)
