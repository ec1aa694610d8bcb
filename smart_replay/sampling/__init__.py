"""The read path: `tf.data` datasets of a buffer, and mixing a starter in.

`dataset` (a table as `tf.data`, with `ReplayInfo`), `items`, `priorities`,
`epochs`, `replay_buffer` (the TF-Agents `ReplayBuffer` face), and the
offline-to-online mix (`mixing`, `schedule`): a read-only starter table
(`backends.starter.StarterSource`) mixed into each batch with a fixed or
annealed fraction::

    manager = ReplayBufferManager.from_checkpoint(
        starter, checkpoint_dir='runs/sac/buffer', starter_dir=starter)
    manager.create_replay_buffer()        # the online table starts empty
    dataset = manager.get_dataset(
        batch_size=256, num_steps=2, train_step=train_step,
        starter_fraction=smart_replay.mixing.FractionSchedule(
            initial=0.5, final=0.1, steps=50_000))

`smart_replay.mixing` is this package: its public names are below.
"""

from smart_replay.backends.starter import fingerprint
from smart_replay.backends.starter import StarterSource
from smart_replay.sampling.fraction_schedule import FractionSchedule

__all__ = ['FractionSchedule', 'StarterSource', 'fingerprint']
