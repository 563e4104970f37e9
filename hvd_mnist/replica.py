"""The model, its Horovod-wrapped SGD, the global step, the moving averages and the compiled steps."""

from __future__ import annotations

import hashlib

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist.config import TrainConfig
from hvd_mnist.data.idx import NUM_PIXELS
from hvd_mnist.data.pipeline import eval_dataset, scale_pixels
from hvd_mnist.data.sources import Split
from hvd_mnist.distribution import World
from hvd_mnist.model import build_model, correct_predictions, regularized_loss
from hvd_mnist.schedule import MovingAverage, learning_rate

IMAGES_SPEC = tf.TensorSpec([None, NUM_PIXELS], tf.uint8)  # scaled inside the compiled steps
LABELS_SPEC = tf.TensorSpec([None], tf.int64)


class Trainer:
    """Everything that is trained, checkpointed and kept equal across ranks."""

    def __init__(self, config: TrainConfig, world: World) -> None:
        tf.random.set_seed(config.seed)
        self.config = config
        self.model = build_model(config.model, config.mixed_precision)
        # Static loss scaling keeps float16 gradients from underflowing; 1 (a no-op) in float32.
        self.loss_scale = config.loss_scale if config.mixed_precision else 1.0
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # The global batch the checkpointed weights were trained with, to report world-size changes on resume.
        self.global_batch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.decay_steps = tf.Variable(1.0, trainable=False)
        self.lr_scale = tf.Variable(1.0, trainable=False)
        self.set_world_size(world.size)
        self.learning_rate = lambda: learning_rate(
            self.step, config.lr, config.lr_decay, self.decay_steps, self.lr_scale, config.warmup_steps
        )
        # A TF1-style optimizer: Horovod's DistributedOptimizer allreduces its gradients reliably,
        # whereas wrapping a Keras 3 optimizer silently applies each rank's local gradient.
        self.sgd = tf.compat.v1.train.GradientDescentOptimizer(self.learning_rate)
        compression = hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none
        self.optimizer = hvd.DistributedOptimizer(self.sgd, compression=compression)
        self.ema = MovingAverage(list(self.model.trainable_variables), config.ema_decay)

    def set_world_size(self, size: int) -> None:
        """Follow the number of ranks: global batch, LR decay period and (with --scale-lr) the LR scale."""
        self.global_batch.assign(self.config.batch_size * size)
        self.decay_steps.assign(self.config.decay_steps(size))
        self.lr_scale.assign(float(size) if self.config.scale_lr else 1.0)

    @property
    def synced_variables(self) -> list[tf.Variable]:
        """Everything that must be equal on every rank: weights, moving averages, step, global batch."""
        return [*self.model.trainable_variables, *self.ema.shadows, self.step, self.global_batch]

    def trackables(self) -> dict[str, tf.Module | tf.Variable]:
        """What a checkpoint holds."""
        return {"step": self.step, "global_batch": self.global_batch, "model": self.model,
                "optimizer": self.sgd, "ema": self.ema}

    def broadcast_from_chief(self) -> None:
        """Give every rank rank 0's weights, moving averages and step (after initialization or restore)."""
        hvd.broadcast_variables(self.synced_variables, root_rank=0)

    @tf.function(input_signature=[IMAGES_SPEC, LABELS_SPEC], reduce_retracing=True)
    def train_step(self, images: tf.Tensor, labels: tf.Tensor) -> dict[str, tf.Tensor]:
        """One synchronous SGD step on the rank-averaged gradient: the step's only collective.

        Returns this rank's loss and batch accuracy, the LR used, the averaged gradients, and `finite`:
        whether every averaged gradient is finite, which is the same on every rank (a NaN anywhere
        spreads through the average), so all ranks can stop at the same step without another collective.
        """
        variables = list(self.model.trainable_variables)
        captured = {}

        def compute_scaled_loss() -> tf.Tensor:
            captured["logits"] = self.model(scale_pixels(images))
            captured["loss"] = regularized_loss(self.model, captured["logits"], labels, self.config.l2)
            return captured["loss"] * self.loss_scale

        grads_and_vars = self.optimizer.compute_gradients(compute_scaled_loss, var_list=variables)
        if self.loss_scale != 1.0:
            grads_and_vars = [(grad / self.loss_scale, var) for grad, var in grads_and_vars]
        grads = [grad for grad, _ in grads_and_vars]
        lr = self.learning_rate()
        self.optimizer.apply_gradients(grads_and_vars)
        self.ema.update(variables, self.step)
        self.step.assign_add(1)
        batch = tf.cast(tf.shape(labels)[0], tf.float32)
        accuracy = tf.cast(correct_predictions(captured["logits"], labels), tf.float32) / batch
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(grad)) for grad in grads])
        return {"loss": captured["loss"], "accuracy": accuracy, "lr": lr, "grads": grads, "finite": finite}

    @tf.function(reduce_retracing=True)
    def train_steps(self, batches: tf.data.Iterator, count: tf.Tensor) -> dict[str, tf.Tensor]:
        """Up to `count` train_steps on the iterator's next batches in one call, which saves a Python round
        trip per step (measured: 0.6-1 ms/step on 2 cores).

        Stops early after a step whose averaged gradients are not finite. Returns that last step's
        train_step results and `steps`, how many steps ran.
        """
        metrics = self.train_step(*next(batches))
        steps = tf.constant(1, tf.int64)
        while steps < count and metrics["finite"]:
            metrics = self.train_step(*next(batches))
            steps += 1
        return {**metrics, "steps": steps}

    def average_over_ranks(self, values: tf.Tensor) -> tf.Tensor:
        """The mean over ranks of a small vector (loss, accuracy, stop votes) on the steps that report.

        A single rank's values are their own mean; skipping the collective there saves waiting for
        Horovod's next cycle. hvd.size() is asked at each call, so elastic resizes are followed.
        """
        return values if hvd.size() == 1 else self._allreduce_mean(values)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def _allreduce_mean(self, values: tf.Tensor) -> tf.Tensor:
        return hvd.allreduce(values, op=hvd.Average, name="step_metrics")

    @tf.function(input_signature=[IMAGES_SPEC, LABELS_SPEC], reduce_retracing=True)
    def count_correct(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        return correct_predictions(self.model(scale_pixels(images)), labels)

    def evaluate_ema(self, source: Split, world: World) -> float:
        """Test accuracy of the moving-average weights over all ranks' shards of the test set."""
        correct = tf.constant(0, tf.int64)
        seen = tf.constant(0, tf.int64)
        with self.ema.applied(list(self.model.trainable_variables)):
            for images, labels in eval_dataset(source, self.config.eval_batch_size, world.rank, world.size):
                correct += self.count_correct(images, labels)
                seen += tf.size(labels, out_type=tf.int64)
        total_correct, total_seen = hvd.allreduce(tf.stack([correct, seen]), op=hvd.Sum, name="eval_counts").numpy()
        return float(total_correct) / max(int(total_seen), 1)

    def weights_finite(self) -> bool:
        """False if any weight or moving average holds NaN or Inf (never checkpoint such a state)."""
        values = [*self.model.trainable_variables, *self.ema.shadows]
        return all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in values)

    def weights_digest(self) -> str:
        """SHA-256 of the trained weights' bytes, to prove that ranks hold bit-identical weights."""
        digest = hashlib.sha256()
        for var in self.model.trainable_variables:
            digest.update(var.numpy().tobytes())
        return digest.hexdigest()

    def histograms(self, grads: list[tf.Tensor]) -> dict[str, tf.Tensor]:
        """TensorBoard histograms of each weight and its averaged gradient."""
        values = {}
        for var, grad in zip(self.model.trainable_variables, grads, strict=True):
            name = var.name.split(":")[0]
            values[f"weights/{name}"] = var
            values[f"gradients/{name}"] = grad
        return values
