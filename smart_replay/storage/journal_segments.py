"""The segment files of write-ahead journals: names, reading, deleting.

A journal folder holds each writer's records (`journal_records`) in segment
files named `<writer id>.<first seq, 20 digits>.journal`, each opening with
a header record that holds the writer's `meta` (`journal.JournalWriter`
writes them).

`read(folder, writer_id)` returns a writer's records in order, each sequence
number once. A segment is read up to its first torn or damaged record (one
log line names the file and what was dropped); the next segment goes on if
it continues the numbering (a failed fsync's records written again), and
reading stops at the first gap in the numbers. It never raises for damage.
Nothing is read or deleted through a symbolic link.
"""

import dataclasses
import json
import os
import re
import secrets
from typing import Any, Dict, List, Tuple

from absl import logging

from smart_replay import errors
from smart_replay.storage import durable
from smart_replay.storage import journal_records

SUFFIX = '.journal'
FORMAT = 1
# The named steps of writing a journal (`fault_point`): records written to
# the OS, fsynced, and a segment deleted after a checkpoint.
JOURNAL_STEPS = ('written', 'synced', 'dropped')
_WRITER_ID = re.compile(r'[0-9a-f]{1,32}\Z')
_SEGMENT = re.compile(r'([0-9a-f]{1,32})\.(\d{20})' + re.escape(SUFFIX) + r'\Z')


def check_writer_id(writer_id: Any) -> str:
  """Checks a writer id (1 to 32 lower-case hex digits); returns it.

  Raises:
    ValueError: names the bad value.
  """
  if not isinstance(writer_id, str) or not _WRITER_ID.match(writer_id):
    raise ValueError('writer_id must be 1 to 32 lower-case hex digits, got '
                     f'{writer_id!r}.')
  return writer_id


def new_writer_id() -> str:
  """A new writer id: 16 random lower-case hex digits, never all zeros (a
  step's writer ids hold it as a 64-bit number; 0 marks no writer)."""
  return f'{secrets.randbits(63) | 1:016x}'


def segment_name(writer_id: str, first_seq: int) -> str:
  """The file name of a writer's segment that starts at `first_seq`."""
  return f'{writer_id}.{first_seq:020d}{SUFFIX}'


def segments(folder: str) -> Dict[str, List[Tuple[int, str]]]:
  """Every writer's segments in `folder`: {writer id: [(first seq, path)]},
  in order; other files are ignored. An absent folder has none."""
  found: Dict[str, List[Tuple[int, str]]] = {}
  try:
    names = os.listdir(folder)
  except FileNotFoundError:
    return found
  for name in names:
    match = _SEGMENT.match(name)
    if match:
      found.setdefault(match.group(1), []).append(
          (int(match.group(2)), os.path.join(folder, name)))
  for paths in found.values():
    paths.sort()
  return found


@dataclasses.dataclass
class JournalContents:
  """What `read` found of one writer.

  Attributes:
    writer_id: the writer.
    meta: the `meta` its first readable segment's header holds.
    records: its records in order of sequence number, each once, up to the
      first damage or gap.
    damage: where reading stopped early (`journal_records.Damage`), if it
      did.
    bytes: the size of its segment files.
  """
  writer_id: str
  meta: Dict[str, Any]
  records: List[journal_records.Record]
  damage: List[journal_records.Damage]
  bytes: int

  @property
  def last_seq(self) -> int:
    """The highest sequence number read (0 if none)."""
    return self.records[-1].seq if self.records else 0


def read(folder: str, writer_id: str) -> JournalContents:
  """Reads a writer's records; never raises for a damaged file.

  Args:
    folder: the journal's folder.
    writer_id: the writer.

  Returns:
    Its records, each sequence number once and in order, up to the first
    torn or damaged record or gap in the numbers (logged, one line per
    file, and listed in `damage`).

  Raises:
    UnsafeBufferDirError: if a segment is a symbolic link.
    OSError: if a segment cannot be read at all.
  """
  check_writer_id(writer_id)
  contents = JournalContents(writer_id, {}, [], [], 0)
  last = None  # The last sequence number taken.
  for _, path in segments(folder).get(writer_id, []):
    data = _read_file(path)
    contents.bytes += len(data)
    records, damage = journal_records.scan(data, path)
    if damage:  # Later segments may hold its records again (a failed fsync).
      contents.damage.append(damage)
      logging.warning('Journal of writer %s: %s.', writer_id,
                      damage.describe())
    for record in records:
      if record.kind == journal_records.HEADER:
        if not contents.meta:
          contents.meta = json.loads(record.payload.decode()).get('meta', {})
        continue
      if last is not None and record.seq <= last:
        continue  # Written again after a failed fsync: taken once.
      if last is not None and record.seq != last + 1:
        gap = journal_records.Damage(
            path, 0, len(data),
            f'records {last + 1}..{record.seq - 1} are missing before '
            f'record {record.seq}')
        contents.damage.append(gap)
        logging.warning('Journal of writer %s: %s; replay stops at record '
                        '%d.', writer_id, gap.describe(), last)
        return contents
      contents.records.append(record)
      last = record.seq
  return contents


def holds_records(folder: str) -> bool:
  """Whether any writer's journal in `folder` holds a record (not only
  segment headers)."""
  return any(read(folder, writer_id).records
             for writer_id in segments(folder))


def remove_writer(folder: str, writer_id: str) -> int:
  """Deletes every segment of a writer; returns the bytes freed."""
  freed = 0
  for _, path in segments(folder).get(check_writer_id(writer_id), []):
    freed += remove(path)
  if freed:
    durable.fsync_dir(folder)
  return freed


def first_seq_of(path: str) -> int:
  """The first sequence number of a segment, from its name."""
  return int(_SEGMENT.match(os.path.basename(path)).group(2))


def _read_file(path: str) -> bytes:
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
  except OSError as e:
    if os.path.islink(path):
      raise errors.UnsafeBufferDirError(
          f'{path} is a symbolic link, not a journal segment; move it away.'
      ) from e
    raise
  with os.fdopen(fd, 'rb') as f:
    return f.read()


def remove(path: str) -> int:
  """Deletes one segment (not through a link); returns its size."""
  try:
    size = os.lstat(path).st_size
    os.unlink(path)
  except FileNotFoundError:
    return 0
  fault_point('dropped')
  return size


def fault_point(step: str) -> None:
  """A named step of writing a journal (`JOURNAL_STEPS`).

  Does nothing; durability tests replace it to kill the process at exactly
  this step.
  """
  del step
