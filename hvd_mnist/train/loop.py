"""The training loop of one rank: restore, train to the end, act on what the cadence says is due, then finish."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from hvd_mnist.config import TrainConfig
from hvd_mnist.data.pipeline import train_dataset
from hvd_mnist.data.sources import Dataset
from hvd_mnist.errors import RunEnded
from hvd_mnist.runtime.supervisor import RunDir, Supervisor, World, phase_done, phases, process_started_at, writing
from hvd_mnist.train.cadence import REPORTED, Action, Cadence
from hvd_mnist.train.checkpointing import Checkpoints
from hvd_mnist.train.evaluation import Evaluations
from hvd_mnist.train.export import export_at_end
from hvd_mnist.train.replica import Replica
from hvd_mnist.train.restore import log_plan, restore
from hvd_mnist.train.telemetry.outputs import Outputs, Telemetry
from hvd_mnist.train.telemetry.reporting import Throughput, configure_logging
from hvd_mnist.train.telemetry.stragglers import Pace

log = logging.getLogger("hvd_mnist")


@dataclass(frozen=True)
class RunResult:
    """What a finished run reports (the same on every rank)."""

    final_step: int
    final_loss: float
    test_accuracy: float | None
    weights_sha256: list[str]


class TrainingLoop:
    """Trains this rank's replica to --steps (or to --target-accuracy), then checks, tests and exports.

    It holds the run's collaborators, so each part below reads as one step of the story: restore, train,
    do what is due, finish. When something is due comes from one Cadence; everything that keeps the run alive
    (guarded collectives, heartbeats, signals, faults, the ending) is the Supervisor's.
    """

    def __init__(self, config: TrainConfig, world: World, run_dir: RunDir, data: Dataset,
                 supervisor: Supervisor) -> None:
        self.config = config
        self.world = world
        self.run_dir = run_dir
        self.data = data
        self.supervisor = supervisor
        self.replica = Replica(config, world.size, supervisor.planned_delay(world.rank), timed=supervisor.recording)
        self.checkpoints = Checkpoints(run_dir.checkpoints, run_dir.best_checkpoints, config.keep_checkpoints,
                                       **self.replica.trackables())
        self.telemetry = Telemetry(config, run_dir, supervisor)
        self.outputs = Outputs()  # this rank's, while it trains
        self.evaluations = Evaluations(config, data, self.replica, supervisor)
        self.pace = Pace()  # this rank's compute and allreduce wait per step, for finding stragglers

    # --- the story ---------------------------------------------------------------------------------------------

    def fit(self) -> RunResult:
        """Run (or resume) training to the end, then evaluate the moving averages on the test set and export."""
        if self.config.elastic:
            return self._fit_elastic()
        restore(self.config, self.world, self.supervisor, self.checkpoints, self.replica, self.run_dir)
        return self._run()

    def _run(self) -> RunResult:
        """From the replica's current step to the end, then the end-of-run checks, test and export."""
        configure_logging(self.world)
        start_step = int(self.replica.step.numpy())
        phase_done("restored")
        plan = self.replica.plan
        latest = self.checkpoints.latest if self.world.is_chief else None  # only rank 0 reads the run directory
        with self.supervisor.watching(self.world, start_step, latest), \
                self.telemetry.outputs(self.world) as self.outputs:
            changed = {name: [str(v) if isinstance(v, Path) else v for v in values]  # JSON: paths as text
                       for name, values in self.run_dir.config_changes.items()}
            self.outputs.event("start", start_step=start_step, world_size=self.world.size,
                               global_batch=plan.global_batch, accumulate=plan.micro_batches,
                               started_at=process_started_at(), phases=phases(),
                               **({"config_changes": changed} if changed else {}))
            step, loss = self._train(start_step)
            phase_done("trained")
            self.supervisor.training_done()
            return self._finish(step, loss)

    def _train(self, start_step: int) -> tuple[int, float]:
        """The steps, with a pause wherever the cadence has something due; returns the last step and loss."""
        config, replica, supervisor = self.config, self.replica, self.supervisor
        cadence = Cadence.of(config, elastic=config.elastic, fault_step=supervisor.planned_fault("step"))
        batches = iter(train_dataset(self.data.train, config.batch_size, self.world.rank, self.world.size,
                                     config.seed, shuffle=config.shuffle,
                                     start_step=start_step * replica.plan.micro_batches))
        throughput = Throughput(replica.plan.global_batch)
        step_bytes = replica.allreduced_bytes  # for the flight record
        step, loss = start_step, math.nan
        while step < config.steps:
            # The first call runs one step, so that its time (mostly tracing) is a phase of its own.
            count = 1 if step == start_step else cadence.next_pause(step) - step
            self.pace.start()
            with supervisor.guarded(step, "training", step_bytes and step_bytes * count):
                metrics = replica.train_steps(batches, count)
            if step == start_step:
                phase_done("first_call")
            else:
                self.pace.add(int(metrics["steps"]), float(metrics["allreduce_seconds"]))
            step += int(metrics["steps"])
            supervisor.progress(step)
            throughput.tick(int(metrics["steps"]))
            if not bool(metrics["finite"]):
                raise RunEnded(f"training diverged: NaN/Inf gradients at step {step}; all ranks stopped"
                               f"{supervisor.last_checkpoint()}")
            due = cadence.due(step)
            if Action.FAULT in due:
                supervisor.fault("step", step)
            if Action.COMMIT in due:
                supervisor.commit()
            stopping = False
            if due & REPORTED:
                loss, stopping, slowest = self._report(step, due, metrics, throughput)
                cadence = cadence.paced(slowest)
            if Action.HISTOGRAM in due:
                self.outputs.histograms(step, replica.histograms(metrics["grads"]))
            reached = Action.EVAL in due and self.evaluations.validate(step, self.world, self.outputs,
                                                                       self.checkpoints, self.run_dir)
            if stopping or reached or Action.CHECKPOINT in due:
                self._save(step)
            if stopping:
                self._stopped(step)
            if reached:
                break
        return step, loss

    def _finish(self, step: int, loss: float) -> RunResult:
        """Check the ranks agree bit for bit, evaluate the moving averages on the test set, export (rank 0)."""
        digests = self.supervisor.weights_digests(step, self.replica.weights_digest())
        if len(set(digests)) != 1:
            raise RunEnded(f"ranks hold different weights after training: {digests}")
        log.info("weights identical on all %d ranks (sha256 %s)", self.world.size, digests[0][:16])
        accuracy = None
        if self.data.test is not None:
            accuracy = self.evaluations.test(step, self.world)
            log.info("test accuracy with moving-average weights: %.4f", accuracy)
            self.outputs.scalars(step, {"test_accuracy": accuracy})
        phase_done("tested")
        export_at_end(self.config, self.world, self.replica.model, self.replica.ema, self.checkpoints,
                      self.run_dir.export)
        phase_done("exported")
        self.outputs.event("end", step=step, loss=loss, test_accuracy=accuracy, weights_sha256=digests,
                            phases=phases(), evaluation_seconds=round(self.evaluations.seconds, 3))
        return RunResult(step, loss, accuracy, digests)

    # --- what is due at a pause ----------------------------------------------------------------------------------

    def _report(self, step: int, due: frozenset[Action], metrics: dict[str, tf.Tensor],
                throughput: Throughput) -> tuple[float, bool, float]:
        """Average loss, accuracy and stop votes over the ranks, tell the outputs; returns the averaged loss,
        whether any rank asked to stop, and the slowest rank's seconds per step (the same on every rank)."""
        with self.supervisor.guarded(step, "averaging the metrics"):
            means = self.replica.average_over_ranks(metrics["loss"], metrics["accuracy"], self.supervisor.stop_vote,
                                                    self.pace.per_step())
        lr = float(metrics["lr"])
        if not math.isfinite(means.loss):
            raise RunEnded(f"training diverged: loss {means.loss} at step {step}; all ranks stopped"
                           f"{self.supervisor.last_checkpoint()}")
        if Action.LOG in due:
            examples_per_sec, sec_per_batch = throughput.read()
            self.outputs.event("train", step=step, loss=means.loss, accuracy=means.accuracy, lr=lr,
                               examples_per_sec=examples_per_sec, sec_per_batch=sec_per_batch,
                               rank_compute_ms=[round(compute * 1e3, 3) for compute, _ in means.paces],
                               rank_allreduce_wait_ms=[round(wait * 1e3, 3) for _, wait in means.paces])
            if self.pace.full:
                self.pace.reset()
                self.outputs.paces(step, means.paces)
        if Action.SUMMARY in due:
            self.outputs.scalars(step, {"loss": means.loss, "accuracy": means.accuracy, "learning_rate": lr})
        return means.loss, means.stop_votes > 0, max(compute + wait for compute, wait in means.paces)

    def _save(self, step: int) -> None:
        """Checkpoint on rank 0, but never a state holding NaN/Inf (every rank checks: the weights are equal)."""
        if not self.replica.weights_finite():
            raise RunEnded(f"weights became NaN/Inf by step {step}; not checkpointed"
                           f"{self.supervisor.last_checkpoint()}")
        if self.world.is_chief:  # HVD: only rank 0 writes checkpoints (the ranks hold the same weights)
            with writing(f"checkpoint ckpt-{step}", self.run_dir.checkpoints):
                path = self.checkpoints.save(step, before_commit=lambda: self.supervisor.fault("save", step))
            self.supervisor.checkpointed(path)
            log.info("saved checkpoint %s", path)

    def _stopped(self, step: int) -> None:
        """End the run after a stop request: every rank got here at the same step, and rank 0 has checkpointed."""
        saved = f"checkpoint {self.checkpoints.latest} written" if self.world.is_chief else "rank 0 checkpointed it"
        ended = self.supervisor.stopped(step, saved)
        self.outputs.event("stopped", step=step, reason=ended.reason)
        raise ended

    # --- elastic --------------------------------------------------------------------------------------------------

    def _fit_elastic(self) -> RunResult:
        """Horovod Elastic: on every reset the survivors roll back to the last commit, rescale and re-shard."""
        if self.config.restores and self.world.is_chief:  # the first sync gives every rank rank 0's state
            log.info("resumed from %s", self.checkpoints.restore_newest_intact(self.config.resume_from))

        def train(world: World) -> RunResult:  # after Horovod's sync: a worker that just joined has rank 0's state
            self.world = world
            self.replica.follow(world.size)
            log_plan(self.config, self.replica, self.run_dir)
            return self._run()

        def on_reset() -> None:
            log.warning("elastic reset: %d rank(s) now, rolled back to step %d", self.world.refreshed().size,
                        int(self.replica.step.numpy()))

        return self.supervisor.run_elastic(self.replica.synced_variables, self.replica.broadcast_from_chief, self.world,
                                           self.run_dir, train, on_reset)
