"""What one step is: its spec and how it is validated.

The bottom of the data flow (spec -> layouts -> config -> storage -> server
-> backends -> writing -> sampling -> manager): `specs` (spec <-> JSON,
signatures), `structure` (a nest's containers against the spec's) and
`validation`/`value_checks` (a step against the spec). How a step is stored
in Reverb is `smart_replay.layouts`.
"""
