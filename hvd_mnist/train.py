"""The training loop: Horovod-averaged SGD steps, moving averages, checkpoints and the final evaluation."""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist.checkpointing import Checkpoints
from hvd_mnist.config import TrainConfig
from hvd_mnist.data.idx import NUM_PIXELS
from hvd_mnist.data.pipeline import Source, eval_dataset, train_dataset
from hvd_mnist.distribution import World, on_chief
from hvd_mnist.errors import UserError
from hvd_mnist.export import export_model
from hvd_mnist.model import build_model, correct_predictions, regularized_loss
from hvd_mnist.reporting import Reporter, Throughput
from hvd_mnist.schedule import MovingAverage, learning_rate

log = logging.getLogger("hvd_mnist")

IMAGES_SPEC = tf.TensorSpec([None, NUM_PIXELS], tf.float32)
LABELS_SPEC = tf.TensorSpec([None], tf.int64)


@dataclass(frozen=True)
class RunResult:
    """What a finished run reports (the same on every rank)."""

    final_step: int
    final_loss: float
    test_accuracy: float | None
    weights_sha256: list[str]


class Trainer:
    """The model, its Horovod-wrapped SGD, the global step and the moving averages of the weights."""

    def __init__(self, config: TrainConfig, world: World) -> None:
        tf.random.set_seed(config.seed)
        self.config = config
        self.model = build_model(config.model)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        decay_steps = config.decay_steps(world.size)
        lr_scale = float(world.size) if config.scale_lr else 1.0
        self.learning_rate = lambda: learning_rate(
            self.step, config.lr, config.lr_decay, decay_steps, lr_scale, config.warmup_steps
        )
        # A TF1-style optimizer: Horovod's DistributedOptimizer allreduces its gradients reliably,
        # whereas wrapping a Keras 3 optimizer silently applies each rank's local gradient.
        self.sgd = tf.compat.v1.train.GradientDescentOptimizer(self.learning_rate)
        self.optimizer = hvd.DistributedOptimizer(self.sgd)
        self.ema = MovingAverage(list(self.model.trainable_variables), config.ema_decay)

    @property
    def variables(self) -> list[tf.Variable]:
        """Every variable that must agree across ranks."""
        return [*self.model.trainable_variables, *self.ema.shadows, self.step]

    def broadcast_from_chief(self) -> None:
        """Give every rank rank 0's variables (after initialization or restore)."""
        hvd.broadcast_variables(self.variables, root_rank=0)

    @tf.function(input_signature=[IMAGES_SPEC, LABELS_SPEC], reduce_retracing=True)
    def train_step(self, images: tf.Tensor, labels: tf.Tensor) -> dict[str, tf.Tensor]:
        """One synchronous SGD step on the rank-averaged gradient; returns rank-averaged loss and accuracy."""
        variables = list(self.model.trainable_variables)
        captured = {}

        def compute_loss() -> tf.Tensor:
            captured["logits"] = self.model(images)
            captured["loss"] = regularized_loss(self.model, captured["logits"], labels, self.config.l2)
            return captured["loss"]

        grads_and_vars = self.optimizer.compute_gradients(compute_loss, var_list=variables)
        lr = self.learning_rate()
        self.optimizer.apply_gradients(grads_and_vars)
        self.ema.update(variables, self.step)
        self.step.assign_add(1)
        loss = captured["loss"]
        accuracy = tf.cast(correct_predictions(captured["logits"], labels), tf.float32) / tf.cast(
            tf.shape(labels)[0], tf.float32
        )
        mean_loss, mean_accuracy = tf.unstack(hvd.allreduce(tf.stack([loss, accuracy]), op=hvd.Average))
        return {"loss": mean_loss, "accuracy": mean_accuracy, "lr": lr, "grads": [g for g, _ in grads_and_vars]}

    @tf.function(input_signature=[IMAGES_SPEC, LABELS_SPEC], reduce_retracing=True)
    def count_correct(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        return correct_predictions(self.model(images), labels)

    def evaluate_ema(self, source: Source, world: World) -> float:
        """Test accuracy of the moving-average weights over all ranks' shards of the test set."""
        correct = tf.constant(0, tf.int64)
        seen = tf.constant(0, tf.int64)
        with self.ema.applied(list(self.model.trainable_variables)):
            for images, labels in eval_dataset(source, self.config.eval_batch_size, world.rank, world.size):
                correct += self.count_correct(images, labels)
                seen += tf.size(labels, out_type=tf.int64)
        total_correct, total_seen = hvd.allreduce(tf.stack([correct, seen]), op=hvd.Sum, name="eval_counts").numpy()
        return float(total_correct) / max(int(total_seen), 1)

    def weights_digest(self) -> str:
        """SHA-256 of the trained weights' bytes, to prove that ranks hold bit-identical weights."""
        digest = hashlib.sha256()
        for var in self.model.trainable_variables:
            digest.update(var.numpy().tobytes())
        return digest.hexdigest()


def _histograms(trainer: Trainer, grads: list[tf.Tensor]) -> dict[str, tf.Tensor]:
    values = {}
    for var, grad in zip(trainer.model.trainable_variables, grads, strict=True):
        name = var.name.split(":")[0]
        values[f"weights/{name}"] = var
        values[f"gradients/{name}"] = grad
    return values


def train(
    config: TrainConfig,
    world: World,
    output_dir: Path,
    train_source: Source,
    test_source: Source | None,
) -> RunResult:
    """Run (or resume) training to config.steps, then checkpoint, evaluate with EMA weights and export."""
    trainer = Trainer(config, world)
    checkpoints = Checkpoints(
        output_dir / "checkpoints", config.keep_checkpoints,
        step=trainer.step, model=trainer.model, optimizer=trainer.sgd, ema=trainer.ema,
    )
    if config.resume:
        restored = on_chief(world, checkpoints.restore_latest, "restore")
        log.info("resumed from %s", restored)
    trainer.broadcast_from_chief()
    start_step = int(trainer.step.numpy())
    if start_step >= config.steps:
        raise UserError(f"--resume: the checkpoint is at step {start_step}, not before --steps {config.steps}")

    reporter = Reporter(output_dir, enabled=world.is_chief)
    global_batch = config.batch_size * world.size
    reporter.event("start", start_step=start_step, world_size=world.size, global_batch=global_batch)
    batches = iter(train_dataset(train_source, config.batch_size, world.rank, world.size, config.seed,
                                 shuffle=config.shuffle, start_step=start_step))
    throughput = Throughput(global_batch)
    metrics = {}
    for step in range(start_step + 1, config.steps + 1):
        images, labels = next(batches)
        metrics = trainer.train_step(images, labels)
        throughput.tick()
        loss = float(metrics["loss"])
        if not math.isfinite(loss):
            raise UserError(f"loss is {loss} at step {step}; stopping (last checkpoint: {checkpoints.latest})")
        if step % config.log_every == 0 or step == config.steps:
            examples_per_sec, sec_per_batch = throughput.read()
            lr, accuracy = float(metrics["lr"]), float(metrics["accuracy"])
            log.info("step %d/%d  loss %.4f  accuracy %.3f  lr %.6f  %.0f examples/sec  %.4f sec/batch",
                     step, config.steps, loss, accuracy, lr, examples_per_sec, sec_per_batch)
            reporter.event("train", step=step, loss=loss, accuracy=accuracy, lr=lr,
                           examples_per_sec=examples_per_sec, sec_per_batch=sec_per_batch)
        if step % config.summary_every == 0:
            reporter.scalars(step, {"loss": loss, "accuracy": float(metrics["accuracy"]),
                                    "learning_rate": float(metrics["lr"])})
        if step % config.histogram_every == 0:
            reporter.histograms(step, _histograms(trainer, metrics["grads"]))
        if world.is_chief and (step % config.checkpoint_every == 0 or step == config.steps):
            log.info("saved checkpoint %s", checkpoints.save(step))

    digests = hvd.allgather_object(trainer.weights_digest(), name="weights_digest")
    if len(set(digests)) != 1:
        raise RuntimeError(f"ranks hold different weights after training: {digests}")
    log.info("weights identical on all %d ranks (sha256 %s)", world.size, digests[0][:16])

    accuracy = None
    if test_source is not None:
        accuracy = trainer.evaluate_ema(test_source, world)
        log.info("test accuracy with moving-average weights: %.4f", accuracy)
        reporter.scalars(config.steps, {"test_accuracy": accuracy})
    if world.is_chief:
        export_dir = export_model(trainer.model, trainer.ema, output_dir / "export")
        log.info("exported the moving-average model to %s", export_dir)
    final_loss = float(metrics["loss"]) if metrics else math.nan
    reporter.event("end", step=config.steps, loss=final_loss, test_accuracy=accuracy,
                   weights_sha256=digests)
    reporter.close()
    return RunResult(config.steps, final_loss, accuracy, digests)
