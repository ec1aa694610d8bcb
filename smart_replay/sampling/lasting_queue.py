"""A TensorFlow FIFO queue that lives as long as the process.

The batcher's feeds and batches meet in such queues (`batcher`): a
`tf.data` thread can be blocked in one when the interpreter exits, so the
queue must outlive every iterator.
"""

import uuid
from typing import Any, List, Sequence

import tensorflow as tf


class LastingQueue:
  """A TensorFlow FIFO queue that is never destroyed (raw ops, a unique
  shared name, no deleter).

  A `tf.queue.FIFOQueue` is destroyed with its Python object, which at
  interpreter exit may happen before a `tf.data` iterator blocked in it is
  destroyed: cancelling that blocked op then crashed the process (seen:
  SIGSEGV in `QueueBase::Cancel` from `~IteratorResource`). These queues
  live as long as the process.

  Args:
    dtypes: the components' dtypes.
    shapes: the components' shapes.
    capacity: elements it holds.
  """

  def __init__(self, dtypes: Sequence[tf.DType],
               shapes: Sequence[Any], capacity: int):
    self._dtypes = list(dtypes)
    self.handle = tf.raw_ops.FIFOQueueV2(
        component_types=self._dtypes, shapes=list(shapes), capacity=capacity,
        container='', shared_name=f'smart_replay_queue_{uuid.uuid4().hex}')

  def enqueue(self, components: Sequence[Any]) -> tf.Operation:
    """Adds one element (waits while full)."""
    return tf.raw_ops.QueueEnqueueV2(handle=self.handle,
                                     components=list(components))

  def dequeue(self) -> List[tf.Tensor]:
    """Takes one element (waits while empty)."""
    return tf.raw_ops.QueueDequeueV2(handle=self.handle,
                                     component_types=self._dtypes)

  def dequeue_many(self, n: Any) -> List[tf.Tensor]:
    """Takes `n` elements, stacked (waits until there are `n`)."""
    return tf.raw_ops.QueueDequeueManyV2(handle=self.handle, n=n,
                                         component_types=self._dtypes)

  def size(self) -> tf.Tensor:
    """Elements it holds now."""
    return tf.raw_ops.QueueSizeV2(handle=self.handle)

  def enqueue_many(self, components: Sequence[Any]) -> tf.Operation:
    """Adds the elements stacked in `components` (waits while full)."""
    return tf.raw_ops.QueueEnqueueManyV2(handle=self.handle,
                                         components=list(components))
