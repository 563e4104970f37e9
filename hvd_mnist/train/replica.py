"""One rank's replica: the model, plain SGD, the global step, the moving averages, and the compiled steps on them.

The Horovod pattern is here as in examples/custom_loop.py, each step marked "HVD:" where it happens: the
gradients averaged over the ranks (_allreduce_mean) and every rank started from rank 0's state
(broadcast_from_chief); the rest of it is in runtime/world/distribution.py, data/pipeline.py and train/loop.py.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvd_mnist.config import TrainConfig
from hvd_mnist.data.idx import NUM_PIXELS
from hvd_mnist.data.pipeline import scale_pixels
from hvd_mnist.train.model import correct_predictions, cross_entropy, regularized_loss
from hvd_mnist.train.plan import BatchPlan
from hvd_mnist.train.schedule import MovingAverage, learning_rate
from hvd_mnist.train.user_model import build_model

IMAGES_SPEC = tf.TensorSpec([None, NUM_PIXELS], tf.uint8)  # scaled inside the compiled steps
LABELS_SPEC = tf.TensorSpec([None], tf.int64)


@dataclass(frozen=True)
class Evaluation:
    """Accuracy and mean cross-entropy of the moving-average weights over every rank's shard of a split."""

    accuracy: float
    loss: float
    examples: int


class RankMeans(NamedTuple):
    """A reporting step's figures averaged over the ranks; stop_votes > 0 if any rank was asked to stop; and
    each rank's own pace: (compute, allreduce wait) in seconds per step, by rank."""

    loss: float
    accuracy: float
    stop_votes: float
    paces: list[tuple[float, float]]


class Replica:
    """Everything that is trained, checkpointed and kept equal across ranks, and the compiled steps on it."""

    def __init__(self, config: TrainConfig, world_size: int, step_delay: float = 0.0, timed: bool = True) -> None:
        """`step_delay`: seconds of planned slowness in every step's compute on this rank (the straggler tests);
        `timed`: each step's allreduce is timed (the flight recorder, on unless HVD_MNIST_FLIGHT_RECORDER=0)."""
        tf.random.set_seed(config.seed)
        self.config = config
        self.step_delay = step_delay
        self.timed = timed
        self.model = build_model(config.model, config.mixed_precision, config.seed)
        # Static loss scaling keeps float16 gradients from underflowing; 1 (a no-op) in float32.
        self.loss_scale = config.loss_scale if config.mixed_precision else 1.0
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # The global batch the checkpointed weights were trained with, to report world-size changes on resume.
        self.global_batch = tf.Variable(0, dtype=tf.int64, trainable=False)
        # With --keep-global-batch: the global batch of the first start, which later world sizes approach.
        self.target_global_batch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.best_accuracy = tf.Variable(-1.0, trainable=False)  # best validation accuracy so far (--keep-best)
        # Set from the batch plan (follow), and read by the compiled steps, so a new world needs no retrace.
        self.micro_batches = tf.Variable(config.accumulate, dtype=tf.int64, trainable=False)
        self.decay_steps = tf.Variable(1.0, trainable=False)
        self.lr_scale = tf.Variable(1.0, trainable=False)
        self.plan = self.follow(world_size)
        self.learning_rate = lambda: learning_rate(
            self.step, config.lr, config.lr_decay, self.decay_steps, self.lr_scale, config.warmup_steps
        )
        self.compression = hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none
        self.ema = MovingAverage(list(self.model.trainable_variables), config.ema_decay)

    def follow(self, world_size: int) -> BatchPlan:
        """Train as the batch plan of `world_size` ranks says (the first start's global batch is the target that
        --keep-global-batch keeps), and return that plan."""
        if self.config.keep_global_batch and int(self.target_global_batch.numpy()) == 0:
            self.target_global_batch.assign(BatchPlan.of(self.config, world_size).global_batch)
        self.plan = BatchPlan.of(self.config, world_size, int(self.target_global_batch.numpy()))
        self.micro_batches.assign(self.plan.micro_batches)
        self.global_batch.assign(self.plan.global_batch)
        self.decay_steps.assign(self.plan.decay_steps)
        self.lr_scale.assign(self.plan.lr_scale)
        return self.plan

    @property
    def synced_variables(self) -> list[tf.Variable]:
        """Everything that must be equal on every rank: weights, moving averages, step and the batch bookkeeping."""
        return [*self.model.trainable_variables, *self.ema.shadows, self.step, self.global_batch,
                self.target_global_batch, self.best_accuracy]

    @property
    def allreduced_bytes(self) -> int | None:
        """What one step's gradient allreduce carries from each rank (None: one rank, no allreduce)."""
        if not self.plan.across_ranks:
            return None
        return sum(var.shape.num_elements() * (2 if self.config.fp16_allreduce else var.dtype.size)
                   for var in self.model.trainable_variables)

    def trackables(self) -> dict[str, tf.Module | tf.Variable]:
        """What a checkpoint holds."""
        return {"step": self.step, "global_batch": self.global_batch, "target_global_batch": self.target_global_batch,
                "best_accuracy": self.best_accuracy, "model": self.model, "ema": self.ema}

    @tf.function(autograph=False)
    def broadcast_from_chief(self) -> None:
        """Give every rank rank 0's weights, moving averages and step (after initialization or restore).

        HVD: every rank starts from rank 0's state. Plain SGD keeps no state of its own (no slots), so the
        synced variables are all of the optimizer's state too.

        What hvd.broadcast_variables does, compiled without AutoGraph: its own tf.function converts Horovod's
        code first, most of the broadcast's time at every start (docs/benchmark.md).
        """
        for var in self.synced_variables:
            var.assign(hvd.broadcast(var, root_rank=0))

    def train_steps(self, batches: tf.data.Iterator, count: int) -> dict[str, tf.Tensor]:
        """Up to `count` train steps on the iterator's next batches in one compiled call, which saves a Python
        round trip per step. Stops early after a step whose averaged gradients are not finite. Returns that last
        step's results and `steps`, how many steps ran."""
        return self._train_steps(batches, tf.constant(count, tf.int64), self.plan.across_ranks)

    @tf.function(reduce_retracing=True, autograph=False)
    def _train_steps(self, batches: tf.data.Iterator, count: tf.Tensor, across_ranks: bool) -> dict[str, tf.Tensor]:
        """`across_ranks` is traced once per value, so a world that grows from one rank starts averaging.

        The loops are tf.while_loop, not Python loops for AutoGraph: converting this code and Horovod's was
        most of the first call's time (docs/benchmark.md). The step is traced once, as the loop's body, from
        zeros that are never returned (`count` is at least 1): a first step traced outside the loop doubled the
        graph that the first call traces and optimizes.
        """

        def more(steps: tf.Tensor, metrics: dict[str, tf.Tensor]) -> tf.Tensor:
            return tf.logical_and(steps < count, metrics["finite"])

        def step(steps: tf.Tensor, metrics: dict[str, tf.Tensor]) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
            result = self._train_step(batches, across_ranks)
            waited = result["allreduce_seconds"] + metrics["allreduce_seconds"]  # summed over the call's steps
            return steps + 1, {**result, "allreduce_seconds": waited}

        zero = tf.constant(0.0)
        before = {"loss": zero, "accuracy": zero, "lr": zero, "finite": tf.constant(True),
                  "grads": [tf.zeros_like(var) for var in self.model.trainable_variables],
                  "allreduce_seconds": tf.constant(0.0, tf.float64)}
        steps, metrics = tf.while_loop(more, step, (tf.constant(0, tf.int64), before))
        return {**metrics, "steps": steps}

    def _train_step(self, batches: tf.data.Iterator, across_ranks: bool) -> dict[str, tf.Tensor]:
        """One synchronous SGD update: this rank's gradients averaged over `micro_batches` batches, then
        averaged over the ranks in the step's only collective.

        Returns this rank's mean loss and accuracy, the LR used, the averaged gradients, the seconds this rank
        spent in the allreduce (waiting for its peers, mostly), and `finite`: whether every averaged gradient is
        finite, which is the same on every rank (a NaN anywhere spreads through the average), so all ranks can
        stop at the same step without another collective.
        """
        variables = list(self.model.trainable_variables)
        # 1/K and the loss scale are folded into the scalar loss, so the summed gradients need no pass of their
        # own to be averaged; each pass over the 397,510 parameters costs about 0.04 ms (docs/benchmark.md).
        count = tf.cast(self.micro_batches, tf.float32)
        loss_factor = self.loss_scale / count

        def micro_batch() -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor]:
            images, labels = next(batches)
            if self.step_delay:
                slowed = tf.numpy_function(lambda x: time.sleep(self.step_delay) or x, [images], images.dtype,
                                           stateful=True)
                images = tf.ensure_shape(slowed, images.shape)
            with tf.GradientTape() as tape:
                logits = self.model(scale_pixels(images))
                micro_loss = regularized_loss(self.model, logits, labels, self.config.l2)
                scaled_loss = micro_loss * loss_factor
            return (tape.gradient(scaled_loss, variables), micro_loss, correct_predictions(logits, labels),
                    tf.size(labels, out_type=tf.int64))

        def add_micro_batch(done: tf.Tensor, sums: list[tf.Tensor], loss: tf.Tensor, correct: tf.Tensor,
                            seen: tf.Tensor) -> tuple[tf.Tensor, ...]:
            grads, micro_loss, micro_correct, micro_seen = micro_batch()
            return (done + 1, [total + grad for total, grad in zip(sums, grads, strict=True)], loss + micro_loss,
                    correct + micro_correct, seen + micro_seen)

        # The first micro-batch starts the sums (no zeros to add to); the loop adds the other K - 1.
        start = (tf.constant(1, tf.int64), *micro_batch())
        _, sums, loss, correct, seen = tf.while_loop(lambda done, *_: done < self.micro_batches, add_micro_batch,
                                                     start)
        grads = sums if self.loss_scale == 1.0 else [total / self.loss_scale for total in sums]
        waited = tf.constant(0.0, tf.float64)
        if across_ranks:
            reduced = self._allreduce_mean(grads)
            if self.timed:
                # From every gradient ready to every average ready. The allreduce does not wait for the first
                # timestamp: that dependency cost 1.3% at batch 100 (history.md, 2026-12-05).
                with tf.control_dependencies(grads):
                    entered = tf.timestamp()
                with tf.control_dependencies(reduced):
                    waited = tf.timestamp() - entered
            grads = reduced
        lr = self.learning_rate()
        for var, grad in zip(variables, grads, strict=True):  # var -= lr * grad, in place, one kernel a variable
            tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=tf.cast(lr, var.dtype), delta=grad)
        self.ema.update(variables, self.step)
        self.step.assign_add(1)
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(grad)) for grad in grads])
        accuracy = tf.cast(correct, tf.float32) / tf.cast(seen, tf.float32)
        return {"loss": loss / count, "accuracy": accuracy, "lr": lr, "grads": grads, "finite": finite,
                "allreduce_seconds": waited}

    def _allreduce_mean(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        """Each gradient averaged over the ranks in one fused ring allreduce (HVD: average the gradients).

        Called by hand rather than through hvd.DistributedOptimizer so that several micro-batches can be
        summed first. Grouped, the gradients reach Horovod's queue together, so its background thread
        negotiates them in one cycle instead of finding some in the next.
        """
        return hvd.grouped_allreduce(grads, op=hvd.Average, compression=self.compression)

    def average_over_ranks(self, loss: tf.Tensor, accuracy: tf.Tensor, stop_vote: float,
                           pace: tuple[float, float]) -> RankMeans:
        """Loss, accuracy and stop votes averaged over the ranks, and each rank's `pace` (compute and allreduce
        wait per step), in one small allgather on the steps that report."""
        values = tf.stack([loss, accuracy, tf.constant(stop_vote, tf.float32), *tf.constant(pace, tf.float32)])
        rows = (self._allgather_metrics(values) if self.plan.across_ranks else values[None]).numpy()
        means = rows[:, :3].astype(np.float64).mean(axis=0).tolist()
        return RankMeans(*means, paces=[(float(compute), float(wait)) for compute, wait in rows[:, 3:]])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)], autograph=False)
    def _allgather_metrics(self, values: tf.Tensor) -> tf.Tensor:
        return hvd.allgather(values[None], name="step_metrics")

    @tf.function(input_signature=[IMAGES_SPEC, LABELS_SPEC], reduce_retracing=True, autograph=False)
    def _eval_batch(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """[correct predictions, summed cross-entropy, examples] of one batch, as float64."""
        logits = self.model(scale_pixels(images))
        return tf.cast(tf.stack([tf.cast(correct_predictions(logits, labels), tf.float32),
                                 tf.reduce_sum(cross_entropy(logits, labels)),
                                 tf.cast(tf.size(labels), tf.float32)]), tf.float64)

    def evaluate(self, batches: Sequence[tuple[tf.Tensor, tf.Tensor]]) -> Evaluation:
        """The moving-average weights on every rank's batches of a split, summed over ranks in one collective."""
        totals = tf.zeros([3], tf.float64)
        with self.ema.applied(list(self.model.trainable_variables)):
            for images, labels in batches:
                totals += self._eval_batch(images, labels)
        if self.plan.across_ranks:
            totals = hvd.allreduce(totals, op=hvd.Sum, name="eval_totals")
        correct, loss_sum, examples = totals.numpy().tolist()
        examples = max(int(examples), 1)
        return Evaluation(accuracy=correct / examples, loss=loss_sum / examples, examples=examples)

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
