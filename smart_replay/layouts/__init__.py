"""Layouts: how a buffer stores its steps in Reverb, written and read back.

A layout owns both directions of its format, below the write path
(`writing`) and the read path (`sampling`), which never import each other;
every layout supplies the same members (`protocol.StepLayout`), so neither
path asks which format it holds:

* `packed_steps`: one Reverb column per field ('columns'), or every field of
  a step in one `uint8` row ('packed'; `StepCodec`), decoded in-graph;
* `frame_cells`, `frame_blobs` and `frame_stacks`: a stacked pixel field
  stored once per frame (cells of new frames, compressed with zstd or zlib)
  and the stacks rebuilt (`FrameStackedLayout`);
* `packed_items`: blocks of consecutive packed steps as one item each
  (`BlockBuilder`), and the windows cut back out of them.

This module builds the layout of a config or manifest: `make_layout` from a
layout name ('packed' or 'columns') and an optional `FrameStack` (found by
`frame_cells.detect_frame_stack` when a new buffer names none);
`layout_from_manifest` rebuilds the one a manifest records and checks it
against what this machine would build.
"""

from typing import Any, Mapping, Optional

from smart_replay.layouts import frame_cells
from smart_replay.layouts import frame_stacks
from smart_replay.layouts import packed_steps
from smart_replay.spec import specs


def make_layout(name: str, data_spec: Any,
                frame_stack: Optional[frame_cells.FrameStack] = None, *,
                writer_ids: bool = False) -> Any:
  """The layout of a buffer.

  Args:
    name: 'packed' or 'columns'.
    data_spec: the spec of one step.
    frame_stack: a stacked pixel field to store once per frame (packed
      layout only), or None.
    writer_ids: whether each stored step carries its writer ids (packed
      layout only; see `packed_steps.StepCodec`).

  Returns:
    A `protocol.StepLayout`: a `packed_steps.Layout`, or a
    `frame_stacks.FrameStackedLayout`.

  Raises:
    ValueError: if the name is unknown, a field cannot be stored that way,
      or `frame_stack` is given with another layout than 'packed'.
  """
  if frame_stack is None:
    return packed_steps.Layout(name, data_spec, ids=writer_ids)
  if name != 'packed':
    raise ValueError(f'frame_stack={frame_stack!r} needs layout=\'packed\', '
                     f'got layout={name!r}.')
  return frame_stacks.FrameStackedLayout(data_spec, frame_stack,
                                         ids=writer_ids)


def stored_frame_stack(stored: Mapping[str, Any]
                       ) -> Optional[frame_cells.FrameStack]:
  """The frame stack a manifest (or a served config) records.

  Args:
    stored: a manifest or `record.build_config` dict.

  Returns:
    Its `FrameStack`, or None (also for manifests written before frame
    stacks existed).
  """
  option = packed_steps.stored_layout(stored).get('frame_stack')
  return None if option is None else frame_cells.FrameStack(**option)


def layout_from_manifest(stored: Mapping[str, Any]) -> Any:
  """The layout a manifest records, checked against this machine.

  Args:
    stored: a manifest or `record.build_config` dict.

  Returns:
    The layout that decodes its checkpoint's items.

  Raises:
    ValueError: if the layout is unknown, or the recorded byte layout is not
      the one this machine would use for the recorded spec (e.g. another
      byte order); names the differing entries.
  """
  recorded = packed_steps.stored_layout(stored)
  layout = make_layout(packed_steps.stored_name(stored),
                       specs.spec_from_json(stored['data_spec']),
                       stored_frame_stack(stored),
                       writer_ids='writer_ids' in recorded)
  here = layout.describe()
  if recorded != here:
    differing = sorted(k for k in set(recorded) | set(here)
                       if recorded.get(k) != here.get(k))
    raise ValueError(
        f'the manifest records a {layout.name!r} layout that differs from '
        f'the one this machine builds for its spec in {differing} (recorded '
        f'{ {k: recorded.get(k) for k in differing} }, here '
        f'{ {k: here.get(k) for k in differing} }).')
  return layout
