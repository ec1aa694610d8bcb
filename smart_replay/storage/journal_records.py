"""The records of a write-ahead journal: framed, numbered and checksummed.

A journal file is a sequence of records, each::

    magic   4 bytes  b'SRJ1'
    length  u32      bytes of the payload
    crc     u32      CRC-32 of seq, kind and payload
    seq     u64      the writer's sequence number of the record
    kind    u8       what the payload is (0: a file's header; others: the
                     journal's user decides)
    payload length bytes

all little-endian, 21 bytes of frame per record. `scan` reads records until
the first that is torn (the file ends inside it) or damaged (wrong magic,
impossible length, checksum mismatch): everything before it is good, and it
says where it stopped and how many bytes it did not trust (`Damage`), the way
Redis loads a truncated append-only file up to its last good command.
"""

import dataclasses
import struct
import zlib
from typing import Iterator, List, Optional, Tuple

MAGIC = b'SRJ1'
_FRAME = struct.Struct('<4sIIQB')
FRAME_BYTES = _FRAME.size
# The frame in two parts (a writer's hot path packs them so): magic, length
# and crc; then seq and kind, which the checksum covers before the payload.
PREFIX = struct.Struct('<4sII')
NUMBERED = struct.Struct('<QB')
_NUMBERED = NUMBERED
# A header record's kind; a journal's user numbers its own kinds from 1.
HEADER = 0
# The largest payload a record may hold (a batch of pixel steps fits).
MAX_PAYLOAD_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class Record:
  """One record: its sequence number, kind and payload."""
  seq: int
  kind: int
  payload: bytes


@dataclasses.dataclass(frozen=True)
class Damage:
  """Where reading a file stopped before its end, and why.

  Attributes:
    path: the file.
    offset: the byte where the first untrusted record starts.
    dropped_bytes: bytes from there to the end of the file.
    reason: e.g. 'torn record (the file ends inside it)'.
  """
  path: str
  offset: int
  dropped_bytes: int
  reason: str

  def describe(self) -> str:
    """One line naming the file, the offset and what was dropped."""
    return (f'{self.path}: {self.reason} at byte {self.offset:,}; the '
            f'{self.dropped_bytes:,} byte(s) from there on are dropped')


def header(seq: int, kind: int, payload: bytes) -> bytes:
  """The frame of a record, without its payload (`frame` checks arguments;
  this does not, for the writer's hot path).

  Args:
    seq: its sequence number.
    kind: what it holds.
    payload: its bytes (a bytes-like object).

  Returns:
    The 21 bytes that go before the payload.
  """
  crc = zlib.crc32(payload, zlib.crc32(_NUMBERED.pack(seq, kind)))
  return _FRAME.pack(MAGIC, len(payload), crc, seq, kind)


def frame(seq: int, kind: int, payload: bytes) -> bytes:
  """One record, framed.

  Args:
    seq: its sequence number (0 .. 2**64 - 1).
    kind: what it holds (0 .. 255; 0 is a file's header).
    payload: its bytes (a bytes-like object), at most `MAX_PAYLOAD_BYTES`.

  Returns:
    The frame followed by the payload.

  Raises:
    ValueError: if an argument is out of range; names it.
  """
  if not 0 <= seq < 1 << 64:
    raise ValueError(f'seq must be in 0..2**64-1, got {seq!r}.')
  if not 0 <= kind < 256:
    raise ValueError(f'kind must be in 0..255, got {kind!r}.')
  length = len(payload)
  if length > MAX_PAYLOAD_BYTES:
    raise ValueError(f'a record holds at most {MAX_PAYLOAD_BYTES:,} bytes, '
                     f'got {length:,}.')
  return header(seq, kind, payload) + bytes(payload)


def scan(data: bytes, path: str = '<bytes>'
         ) -> Tuple[List[Record], Optional[Damage]]:
  """Reads the records of one file's bytes up to the first bad one.

  Args:
    data: the file's bytes.
    path: its name, for `Damage`.

  Returns:
    `(records, damage)`: every record before the first torn or damaged one,
    and where reading stopped (None if the file ended cleanly).
  """
  records = []
  for offset, record in _records(memoryview(data)):
    if isinstance(record, str):
      return records, Damage(path, offset, len(data) - offset, record)
    records.append(record)
  return records, None


def _records(view: memoryview) -> Iterator[Tuple[int, object]]:
  """(offset, Record) for each good record; (offset, reason) for the first
  bad one, then stops."""
  offset, end = 0, len(view)
  while offset < end:
    if end - offset < FRAME_BYTES:
      yield offset, 'torn record frame (the file ends inside it)'
      return
    magic, length, crc, seq, kind = _FRAME.unpack_from(view, offset)
    if magic != MAGIC:
      yield offset, f'no record starts here (found {bytes(magic)!r})'
      return
    if length > MAX_PAYLOAD_BYTES:
      yield offset, f'impossible record length {length:,}'
      return
    start = offset + FRAME_BYTES
    if end - start < length:
      yield offset, 'torn record (the file ends inside it)'
      return
    payload = view[start:start + length]
    if zlib.crc32(payload, zlib.crc32(_NUMBERED.pack(seq, kind))) != crc:
      yield offset, f'checksum mismatch in record {seq}'
      return
    yield offset, Record(seq, kind, bytes(payload))
    offset = start + length
