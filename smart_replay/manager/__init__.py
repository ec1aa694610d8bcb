"""The `ReplayBufferManager` facade and what only it uses.

`facade.ReplayBufferManager` (the public class), `arguments` (its options
grouped and checked once), `state` (the guard, the lock, the running buffer
and its counts), `serving` (start, observers, checkpoints, close),
`sampling` and `reporting` (datasets, priorities, stats and epochs).
"""
