"""A running Reverb server: start, restore progress, stats, checkpoints.

`local_server` (an in-process server with bounded waits),
`restore_progress`, `stats` (server_info as counts), `checkpointer` (a
checkpoint through the server, made durable) and `priorities`. The control
service of a standalone server is `smart_replay.control`.
"""
