"""Bounded waits of a stream's writer on the Reverb server, through restarts.

A wait (flush, episode end) that times out is a rate limiter blocking inserts
if the server answers and holds the items (`WaitTimeoutError` at once), or an
unreachable server: then the wait goes on in growing steps, for at most
`reconnect_timeout_s`, while Reverb's writer reconnects and sends the pending
items on its own. A server that comes back counts as a reconnect; one that
does not makes the stream give up (`ServerUnavailableError`).
"""

import time
from typing import Callable, NoReturn, Optional, Tuple

import reverb
from absl import logging

from smart_replay import _reverb_internal as reverb_internal
from smart_replay import errors
from smart_replay.spec import specs
from smart_replay.writing import settings as settings_lib

# Longest single wait while the server does not answer (the writer retries on
# its own meanwhile; each wait ends with a check whether the server is back).
_MAX_RETRY_WAIT_S = 5.0


class ServerWait:
  """Runs one stream's waits on the server, each bounded.

  Args:
    settings: the observer's `settings.WriterSettings`.
    failed: `failed(what, error)` gives the stream up after its writer failed
      for good, and raises `WriteFailedError`.
    give_up: `give_up()` counts what the stream never got stored, starts it
      over, and returns `(lost_steps, lost_items)`.
    outage: `outage(pending)` is told, once a wait starts waiting for the
      server to come back, Reverb's `(unsent, unconfirmed)` items of that
      moment (None if unknown): the others were confirmed by the server
      that is gone.
  """

  def __init__(self, settings: settings_lib.WriterSettings, *,
               failed: Callable[[str, Exception], NoReturn],
               give_up: Callable[[], Tuple[int, int]],
               outage: Callable[[Optional[Tuple[int, int]]], None]):
    self._settings = settings
    self._failed = failed
    self._give_up = give_up
    self._outage = outage

  def _server_holds_items(self, timed_out: Exception) -> bool:
    """Whether a timed-out wait was on items the server has but holds back.

    False while the server does not answer, or while Reverb's writer has not
    sent the items yet (it is reconnecting: gRPC backs off for seconds after
    an outage). True when the server has them but does not confirm them (a
    rate limiter blocks inserts).

    Raises:
      WriteFailedError: if the server that answers serves other tables (it
        was restarted with another config); the stream is given up.
    """
    try:
      info = self._settings.client.server_info(timeout=1)
    except (reverb.errors.DeadlineExceededError, RuntimeError):
      return False
    for name, want in self._settings.signatures.items():
      served = info.get(name)
      got = specs.describe_signature(served and served.signature)
      if got != want:
        self._failed('the wait for the server', RuntimeError(
            f'table {name!r} has signature {got} on the server, this '
            f'observer writes {want}'))
    counts = reverb_internal.pending_counts(timed_out)
    if counts is None:
      return True
    unsent, unconfirmed = counts
    return unconfirmed > 0 or unsent == 0

  def _attempt(self, what: str, call: Callable[[int], None],
               timeout_ms: int) -> Optional[Exception]:
    """Runs `call(timeout_ms)` once.

    Returns:
      None if it succeeded, its `DeadlineExceededError` if it timed out.

    Raises:
      WriteFailedError: if the writer failed for good (see `failed`).
    """
    try:
      call(timeout_ms)
    except reverb.errors.DeadlineExceededError as e:
      return e
    except RuntimeError as e:
      self._failed(what, e)
    return None

  def __call__(self, what: str, call: Callable[[int], None]) -> None:
    """Runs `call(timeout_ms)`, a bounded wait on the server.

    If it times out while the server does not answer, calls it again in
    growing steps for up to `reconnect_timeout_s` while Reverb's writer
    reconnects; then gives the stream up.

    Args:
      what: the wait, for messages (e.g. 'flush').
      call: the wait, given its timeout in milliseconds; raises
        `DeadlineExceededError` on a timeout, `RuntimeError` if the writer
        failed for good.

    Raises:
      WaitTimeoutError: the server answers but does not accept the items.
      ServerUnavailableError: the server did not come back in time.
      WriteFailedError: the writer failed for good (see `failed`).
    """
    settings = self._settings
    timed_out = self._attempt(what, call, settings.timeout_ms)
    if timed_out is None:
      return
    address = settings.client.server_address
    timeout_s = settings.timeout_ms / 1000
    if self._server_holds_items(timed_out):
      raise errors.WaitTimeoutError(
          f'Timed out after {timeout_s:g} s at {what}, waiting '
          f'for the Reverb server at {address} to accept '
          f'pending items for tables {settings.table_names}. A rate limiter is '
          'probably blocking inserts (samples_per_insert or '
          'block_inserts_when_full with nothing sampling; see stats()'
          "['tables'][name]['rate_limiter']). The steps already confirmed are "
          'stored.') from timed_out
    began = time.monotonic()
    self._outage(reverb_internal.pending_counts(timed_out))
    logging.warning(
        'The Reverb server at %s does not answer, or its writer is not '
        'reconnected yet (%s waited %g s); waiting up to %g s more '
        '(reconnect_timeout_s). The pending items are kept and sent once it '
        'is back.', address, what, timeout_s, settings.reconnect_timeout_s)
    delay = 0.25
    while True:
      left = settings.reconnect_timeout_s - (time.monotonic() - began)
      if left <= 0:
        break
      late = self._attempt(what, call, max(1, int(min(delay, left) * 1000)))
      if late is not None:
        delay = min(2 * delay, _MAX_RETRY_WAIT_S)
        if not self._server_holds_items(late):
          continue
        # Back, but the items are not accepted yet: the usual bounded wait.
        late = self._attempt(what, call, settings.timeout_ms)
        if late is not None:
          raise errors.WaitTimeoutError(
              f'The Reverb server at {address} came back after '
              f'{time.monotonic() - began:.1f} s, but did not accept the '
              f'pending items of tables {settings.table_names} within '
              f'{timeout_s:g} s at {what} (a rate limiter '
              'blocking inserts?).') from late
      settings.counters.reconnects += 1
      logging.warning('The Reverb server at %s answers again after %.1f s; '
                      'the pending items were sent.', address,
                      time.monotonic() - began)
      if settings.reconnected is not None:
        settings.reconnected.set()
      return
    steps, items = self._give_up()
    raise errors.ServerUnavailableError(
        f'The Reverb server at {address} did not answer for '
        f'{timeout_s + settings.reconnect_timeout_s:g} s '
        f'(write_timeout_s + reconnect_timeout_s) at {what}. {steps} step(s) '
        f'and {items} item(s) written since the last confirmed item are lost '
        f'(counted in num_lost_steps / num_lost_items; total '
        f'{settings.counters.lost_steps} steps). The next step starts a new '
        'episode on a new connection; restart the server (it resumes its last '
        'checkpoint) or raise reconnect_timeout_s.') from timed_out
