"""TF-Agents integrations: buffer summaries and paired agent checkpoints.

TensorBoard scalars of a replay buffer, one line in a TF-Agents Learner::

    import smart_replay
    learner.Learner(..., triggers=[
        smart_replay.BufferSummaries(manager, interval=1000)])

writes `buffer/items`, `inserts`, `samples`, `sample_to_insert_ratio`, the
rate limiter's blocked times and, for prioritized tables, `max_priority`
(see `summaries`) into the Learner's own `<root_dir>/train` event file every
`interval` train steps. Inside your own summary writer's scope,
`smart_replay.write_buffer_summaries(manager, step=train_step)` writes them
once. `paired` saves and restores the agent and the buffer together.
"""

from smart_replay.integrations.summaries import buffer_scalars
from smart_replay.integrations.summaries import BufferSummaries
from smart_replay.integrations.summaries import write_buffer_summaries

__all__ = ['BufferSummaries', 'buffer_scalars', 'write_buffer_summaries']
