"""What one step is: its spec, how it is validated, packed and encoded.

The bottom of the data flow (spec -> config -> storage -> server -> writing
-> sampling -> manager): `specs` (spec <-> JSON), `structure` and
`validation`/`value_checks` (a step against the spec), `packing` (a step as
one row of bytes), `frames`/`frame_stacks`/`layouts` (pixel frames stored
once and rebuilt in the graph).
"""
