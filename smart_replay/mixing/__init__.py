"""Offline-to-online replay: a read-only starter table mixed into each batch.

    starter = 'starter_buffers/office_seq2_2880steps'
    manager = ReplayBufferManager.from_checkpoint(
        starter, checkpoint_dir='runs/sac/buffer', starter_dir=starter)
    manager.create_replay_buffer()        # the online table starts empty
    dataset = manager.get_dataset(
        batch_size=256, num_steps=2, train_step=train_step,
        starter_fraction=smart_replay.mixing.FractionSchedule(
            initial=0.5, final=0.1, steps=50_000))

The starter (`starter.StarterSource`) is served from its own checkpoint,
never written or evicted, and recorded in the run's checkpoints by path and
content fingerprint instead of copied; each batch draws every element from it
with the scheduled probability (`schedule`), with importance weights per
source (`dataset`).
"""

from smart_replay.mixing.schedule import FractionSchedule
from smart_replay.mixing.starter import fingerprint
from smart_replay.mixing.starter import StarterSource

__all__ = ['FractionSchedule', 'StarterSource', 'fingerprint']
