"""The training loop: steps, progress, checkpoints, graceful stops, then evaluation and export."""

from __future__ import annotations

import contextlib
import logging
import math
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist.checkpointing import Checkpoints
from hvd_mnist.config import TrainConfig
from hvd_mnist.data.pipeline import train_dataset
from hvd_mnist.data.sources import Split
from hvd_mnist.distribution import World, on_chief
from hvd_mnist.elastic import VariablesState
from hvd_mnist.errors import RunEnded, StopRequested, UserError, WorkerLost
from hvd_mnist.export import export_model
from hvd_mnist.faults import maybe_kill, planned_step
from hvd_mnist.reporting import Reporter, Throughput, configure_logging
from hvd_mnist.stopping import StopSignal
from hvd_mnist.trainer import Trainer

log = logging.getLogger("hvd_mnist")

# Steps between agreements on stop requests (a signal stops the run within this many steps); also the
# most steps one call of the compiled loop runs.
SYNC_EVERY = 10


@dataclass(frozen=True)
class RunResult:
    """What a finished run reports (the same on every rank)."""

    final_step: int
    final_loss: float
    test_accuracy: float | None
    weights_sha256: list[str]


def _restore(trainer: Trainer, checkpoints: Checkpoints, world: World, config: TrainConfig) -> None:
    """Load the latest checkpoint on rank 0 and share it (or rank 0's initialization) with every rank."""
    if config.resume:
        log.info("resumed from %s", on_chief(world, checkpoints.restore_latest, "restore"))
    trainer.broadcast_from_chief()
    start_step = int(trainer.step.numpy())
    if start_step >= config.steps:
        raise UserError(f"--resume: the checkpoint is at step {start_step}, not before --steps {config.steps}")
    previous, current = int(trainer.global_batch.numpy()), config.batch_size * world.size
    if previous != current:
        log.warning("global batch changes from %d to %d (%d rank(s) x %d) at step %d; the LR schedule follows the "
                    "new global batch", previous, current, world.size, config.batch_size, start_step)
        trainer.global_batch.assign(current)


def _last_checkpoint(checkpoints: Checkpoints, world: World) -> str:
    """'; last good checkpoint: PATH' for rank 0's messages (only rank 0 writes checkpoints)."""
    return f"; last good checkpoint: {checkpoints.latest or 'none'}" if world.is_chief else ""


def _save(trainer: Trainer, checkpoints: Checkpoints, world: World, step: int) -> None:
    """Checkpoint on rank 0, but never a state holding NaN/Inf (every rank checks: the weights are equal)."""
    if not trainer.weights_finite():
        raise RunEnded(f"weights became NaN/Inf by step {step}; not checkpointed{_last_checkpoint(checkpoints, world)}")
    if world.is_chief:
        path = checkpoints.save(step, before_commit=lambda: maybe_kill("save", world.rank, step))
        log.info("saved checkpoint %s", path)


@contextlib.contextmanager
def _lost_worker_ends_run(step: int, checkpoints: Checkpoints, world: World,
                          elastic: VariablesState | None) -> Iterator[None]:
    """Turn a failed collective into WorkerLost (one line, a hint to resume); elastic runs let Horovod recover."""
    try:
        yield
    except tf.errors.OpError:
        if elastic is not None:
            raise
        raise WorkerLost(f"collective failed after step {step}: a worker died or is unreachable"
                         f"{_last_checkpoint(checkpoints, world)}; rerun with --resume") from None


def _next_look(step: int, config: TrainConfig, elastic: bool, fault_step: int | None) -> int:
    """The first step after `step` whose results the loop must see: a report or stop agreement, histogram,
    checkpoint, elastic commit, planned fault, or the last step. The steps up to it run in one call."""
    periods = [config.log_every, config.summary_every, SYNC_EVERY, config.histogram_every, config.checkpoint_every]
    if elastic:
        periods.append(config.commit_every)
    candidates = [(step // every + 1) * every for every in periods] + [config.steps]
    if fault_step is not None and fault_step > step:
        candidates.append(fault_step)
    return min(candidates)


def _report(trainer: Trainer, checkpoints: Checkpoints, world: World, config: TrainConfig, reporter: Reporter,
            throughput: Throughput, step: int, metrics: dict[str, tf.Tensor], stop: StopSignal) -> tuple[float, bool]:
    """Average loss, accuracy and stop votes over the ranks (one small allreduce at np > 1), log and summarize them.

    Returns the averaged loss and whether any rank asked to stop.
    """
    loss, accuracy, stop_votes = trainer.average_over_ranks(
        tf.stack([metrics["loss"], metrics["accuracy"], stop.vote])).numpy().tolist()
    lr = float(metrics["lr"])
    if not math.isfinite(loss):
        raise RunEnded(f"training diverged: loss {loss} at step {step}; all ranks stopped"
                       f"{_last_checkpoint(checkpoints, world)}")
    if step % config.log_every == 0 or step == config.steps:
        examples_per_sec, sec_per_batch = throughput.read()
        log.info("step %d/%d  loss %.4f  accuracy %.3f  lr %.6f  %.0f examples/sec  %.4f sec/batch",
                 step, config.steps, loss, accuracy, lr, examples_per_sec, sec_per_batch)
        reporter.event("train", step=step, loss=loss, accuracy=accuracy, lr=lr,
                       examples_per_sec=examples_per_sec, sec_per_batch=sec_per_batch)
    if step % config.summary_every == 0:
        reporter.scalars(step, {"loss": loss, "accuracy": accuracy, "learning_rate": lr})
    return loss, stop_votes > 0


def _loop(trainer: Trainer, checkpoints: Checkpoints, world: World, config: TrainConfig, reporter: Reporter,
          batches: tf.data.Iterator, start_step: int, stop: StopSignal, elastic: VariablesState | None) -> float:
    """Train from start_step to config.steps; returns the last rank-averaged loss.

    In elastic mode the state is committed every --commit-every steps, and a failed collective is left
    to Horovod Elastic, which rolls back to the last commit and carries on with the ranks that remain.
    """
    throughput = Throughput(config.batch_size * world.size)
    loss = math.nan
    fault_step = planned_step("step", world.rank)
    step = start_step
    while step < config.steps:
        count = _next_look(step, config, elastic is not None, fault_step) - step
        with _lost_worker_ends_run(step, checkpoints, world, elastic):
            metrics = trainer.train_steps(batches, tf.constant(count, tf.int64))
        ran = int(metrics["steps"])
        step += ran
        throughput.tick(ran)
        if not bool(metrics["finite"]):
            raise RunEnded(f"training diverged: NaN/Inf gradients at step {step}; all ranks stopped"
                           f"{_last_checkpoint(checkpoints, world)}")
        maybe_kill("step", world.rank, step)
        if elastic is not None and step % config.commit_every == 0:
            elastic.commit()
        stopping = False
        if any(step % every == 0 for every in (config.log_every, config.summary_every, SYNC_EVERY)) \
                or step == config.steps:
            with _lost_worker_ends_run(step, checkpoints, world, elastic):
                loss, stopping = _report(trainer, checkpoints, world, config, reporter, throughput, step, metrics,
                                         stop)
        if step % config.histogram_every == 0:
            reporter.histograms(step, trainer.histograms(metrics["grads"]))
        if stopping or step % config.checkpoint_every == 0 or step == config.steps:
            _save(trainer, checkpoints, world, step)
        if stopping:
            name = signal.Signals(stop.signum).name if stop.signum else "a signal on another rank"
            reporter.event("stopped", step=step, reason=name)
            raise StopRequested(f"{name} at step {step}; checkpoint {checkpoints.latest} written on rank 0; "
                                "continue with --resume", stop.exit_code())
    return loss


def _finish(trainer: Trainer, world: World, output_dir: Path, test_source: Split | None,
            reporter: Reporter, config: TrainConfig) -> tuple[float | None, list[str]]:
    """Check the ranks agree bit for bit, evaluate the moving averages, export (rank 0)."""
    digests = hvd.allgather_object(trainer.weights_digest(), name="weights_digest")
    if len(set(digests)) != 1:
        raise RunEnded(f"ranks hold different weights after training: {digests}")
    log.info("weights identical on all %d ranks (sha256 %s)", world.size, digests[0][:16])
    accuracy = None
    if test_source is not None:
        accuracy = trainer.evaluate_ema(test_source, world)
        log.info("test accuracy with moving-average weights: %.4f", accuracy)
        reporter.scalars(config.steps, {"test_accuracy": accuracy})
    if world.is_chief:
        log.info("exported the moving-average model to %s", export_model(trainer.model, trainer.ema,
                                                                         output_dir / "export"))
    return accuracy, digests


def _run(trainer: Trainer, checkpoints: Checkpoints, world: World, config: TrainConfig, output_dir: Path,
         sources: tuple[Split, Split | None], elastic: VariablesState | None = None) -> RunResult:
    """Train from the trainer's current step to the end, then check, evaluate and export."""
    configure_logging(world)
    start_step = int(trainer.step.numpy())
    reporter = Reporter(output_dir, enabled=world.is_chief)
    reporter.event("start", start_step=start_step, world_size=world.size, global_batch=config.batch_size * world.size)
    batches = iter(train_dataset(sources[0], config.batch_size, world.rank, world.size, config.seed,
                                 shuffle=config.shuffle, start_step=start_step))
    stop = StopSignal()
    stop.install()
    try:
        final_loss = _loop(trainer, checkpoints, world, config, reporter, batches, start_step, stop, elastic)
        stop.uninstall()
        accuracy, digests = _finish(trainer, world, output_dir, sources[1], reporter, config)
        reporter.event("end", step=config.steps, loss=final_loss, test_accuracy=accuracy, weights_sha256=digests)
    finally:
        stop.uninstall()
        reporter.close()
    return RunResult(config.steps, final_loss, accuracy, digests)


def _run_elastic(trainer: Trainer, checkpoints: Checkpoints, world: World, config: TrainConfig, output_dir: Path,
                 sources: tuple[Split, Split | None]) -> RunResult:
    """Horovod Elastic: on every reset the survivors roll back to the last commit, rescale and re-shard."""
    if config.resume:
        log.info("resumed from %s", checkpoints.restore_latest())  # every process; the first sync agrees
    state = VariablesState(trainer.synced_variables)

    def on_reset() -> None:
        trainer.set_world_size(hvd.size())
        log.warning("elastic reset: %d rank(s) now, continuing from step %d", hvd.size(), int(trainer.step.numpy()))

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def run(state: VariablesState) -> RunResult:
        return _run(trainer, checkpoints, world.refreshed(), config, output_dir, sources, state)

    return run(state)


def train(config: TrainConfig, world: World, output_dir: Path, train_source: Split,
          test_source: Split | None) -> RunResult:
    """Run (or resume) training to config.steps, then evaluate with the moving averages and export."""
    trainer = Trainer(config, world)
    checkpoints = Checkpoints(output_dir / "checkpoints", config.keep_checkpoints, **trainer.trackables())
    if config.elastic:
        return _run_elastic(trainer, checkpoints, world, config, output_dir, (train_source, test_source))
    _restore(trainer, checkpoints, world, config)
    return _run(trainer, checkpoints, world, config, output_dir, (train_source, test_source))
