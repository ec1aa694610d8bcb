"""TensorBoard scalars of a replay buffer: one line in a TF-Agents Learner.

    from smart_replay import telemetry
    learner.Learner(..., triggers=[telemetry.BufferSummaries(
        manager, summary_dir=os.path.join(root_dir, 'train'), interval=1000)])

or, inside your own summary writer's scope,
`telemetry.write_buffer_summaries(manager, step=train_step)`.
"""

from smart_replay.telemetry.summaries import buffer_scalars
from smart_replay.telemetry.summaries import BufferSummaries
from smart_replay.telemetry.summaries import write_buffer_summaries

__all__ = ['BufferSummaries', 'buffer_scalars', 'write_buffer_summaries']
