"""SyncBatchNormalization for Keras 3: Horovod's own passes `fused=False`, which Keras 3's BatchNormalization
refuses. In training, the batch statistics are those of the global batch (every rank's, together), so a small
per-rank batch normalizes as the large one would; in inference it is BatchNormalization."""

from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization whose training-mode mean and variance are computed over all ranks of
    `process_set`: one allreduce (Sum) of the per-channel sum, sum of squares and count, like Keras' own
    `synchronized=True` does under tf.distribute. The allreduce's gradient is an allreduce, so the backward pass
    is synchronized too. Every rank must call it the same number of times."""

    def __init__(self, *args, process_set: hvd.ProcessSet = hvd.global_process_set, **kwargs) -> None:
        if kwargs.pop("fused", False):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        if not callable(getattr(keras.layers.BatchNormalization, "_moments", None)):  # what is overridden below
            raise NotImplementedError("hvd_mnist.keras: this Keras' BatchNormalization has no _moments, which "
                                      "SyncBatchNormalization replaces: it needs updating")
        super().__init__(*args, **kwargs)
        self.process_set = process_set

    def _moments(self, inputs: tf.Tensor, mask: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
        if self.process_set.size() == 1:
            return super()._moments(inputs, mask)
        axes = self._reduction_axes
        kept = tf.ones_like(inputs, tf.bool) if mask is None else tf.broadcast_to(
            tf.cast(mask, tf.bool)[..., tf.newaxis], tf.shape(inputs))
        values = tf.where(kept, inputs, tf.zeros_like(inputs))  # a masked NaN or Inf never reaches the sums
        local = tf.stack([tf.reduce_sum(values, axes), tf.reduce_sum(tf.square(values), axes),
                          tf.reduce_sum(tf.cast(kept, inputs.dtype), axes)])
        total, total_squares, count = tf.unstack(hvd.allreduce(local, op=hvd.Sum, process_set=self.process_set))
        mean = tf.math.divide_no_nan(total, count)
        variance = tf.maximum(tf.math.divide_no_nan(total_squares, count) - tf.square(mean), 0.0)
        return mean, variance
