"""The write path: the observer TF-Agents actors call, and its writer.

`observer.TrajectoryObserver` (a plain callable with `flush()`/`close()`)
plans items (`planner`, `blocks`, `chunking`), writes them through Reverb's
trajectory writer (`writer`, `waits`) and counts what the server confirmed
(`confirmations`, `counters`).
"""
