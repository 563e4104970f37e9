"""The learning-rate schedule and the moving-average decay rule, as functions of the global step."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf


def learning_rate(
    step: tf.Tensor,
    base_lr: float,
    decay_rate: float,
    decay_steps: tf.Tensor | float,
    scale: tf.Tensor | float = 1.0,
    warmup_steps: int = 0,
) -> tf.Tensor:
    """base_lr * decay_rate ** (step / decay_steps), times a factor that ramps linearly from 1 to `scale`
    (HVD: the learning rate scaled by the number of ranks, reached over a warm-up).

    With `--scale-lr`, scale is hvd.size() and the ramp lasts `warmup_steps` (Goyal et al., 2017); with a
    scale of 1 the factor is exactly 1.
    """
    step = tf.cast(step, tf.float32)
    decayed = base_lr * tf.pow(decay_rate, step / decay_steps)
    progress = tf.minimum(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0
    return decayed * (1.0 + (scale - 1.0) * progress)


def ema_decay(step: tf.Tensor, decay: float) -> tf.Tensor:
    """min(decay, (1 + step) / (10 + step)): tf.train.ExponentialMovingAverage's num_updates rule."""
    step = tf.cast(step, tf.float32)
    return tf.minimum(decay, (1.0 + step) / (10.0 + step))


class MovingAverage(tf.Module):
    """Shadow copies of variables, updated as shadow -= (1 - d) * (shadow - value)."""

    def __init__(self, variables: list[tf.Variable], decay: float) -> None:
        super().__init__(name="moving_average")
        self.decay = decay
        self.shadows = [tf.Variable(v, trainable=False, name=v.name.split(":")[0] + "_ema") for v in variables]

    def update(self, variables: list[tf.Variable], step: tf.Tensor) -> None:
        """Move each shadow toward its variable by the step-dependent decay.

        shadow -= (1 - d) * (shadow - value) as one fused update kernel, the same arithmetic as assign_sub of the
        product but without writing the product out: one pass over the weights fewer per step.
        """
        rate = 1.0 - ema_decay(step, self.decay)
        for shadow, value in zip(self.shadows, variables, strict=True):
            tf.raw_ops.ResourceApplyGradientDescent(var=shadow.handle, alpha=rate, delta=shadow - value)

    @contextlib.contextmanager
    def applied(self, variables: list[tf.Variable]) -> Iterator[None]:
        """Within the block the variables hold their moving averages; afterwards their own values again."""
        saved = [tf.identity(v) for v in variables]
        for shadow, var in zip(self.shadows, variables, strict=True):
            var.assign(shadow)
        try:
            yield
        finally:
            for var, value in zip(variables, saved, strict=True):
                var.assign(value)
