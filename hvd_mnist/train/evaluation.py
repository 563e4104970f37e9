"""The moving averages evaluated while training (validation: the best checkpoint, the target accuracy) and at the
end (test), on this rank's share of each split, whose batches are made once per world."""

from __future__ import annotations

import logging
import time

import tensorflow as tf

from hvd_mnist.config import TrainConfig
from hvd_mnist.data.pipeline import eval_batches
from hvd_mnist.data.sources import Dataset
from hvd_mnist.runtime.supervisor import RunDir, Supervisor, World, phase_done, writing
from hvd_mnist.train.checkpointing import Checkpoints
from hvd_mnist.train.replica import Evaluation, Replica
from hvd_mnist.train.telemetry.outputs import Outputs

log = logging.getLogger("hvd_mnist")


class Evaluations:
    """Every evaluation of one rank's replica, and the seconds spent validating while training (the benchmark's
    phases part them out)."""

    def __init__(self, config: TrainConfig, data: Dataset, replica: Replica, supervisor: Supervisor) -> None:
        self.config, self.data, self.replica, self.supervisor = config, data, replica, supervisor
        self.seconds = 0.0
        self._batches: dict[tuple[str, int, int], list[tuple[tf.Tensor, tf.Tensor]]] = {}

    def validate(self, step: int, world: World, outputs: Outputs, checkpoints: Checkpoints, run_dir: RunDir) -> bool:
        """Validation accuracy; keeps the best checkpoint (rank 0 writes it); True once the target is reached."""
        started = time.perf_counter()
        with self.supervisor.guarded(step, "the validation"):
            result = self.on("validation", world)
        self.seconds += time.perf_counter() - started
        outputs.event("eval", step=step, accuracy=result.accuracy, loss=result.loss, examples=result.examples)
        outputs.scalars(step, {"validation/accuracy": result.accuracy, "validation/loss": result.loss})
        if self.config.keep_best and result.accuracy > float(self.replica.best_accuracy.numpy()):
            self.replica.best_accuracy.assign(result.accuracy)
            if world.is_chief:
                with writing(f"the best checkpoint (step {step})", run_dir.best_checkpoints):
                    log.info("best validation accuracy so far: saved %s", checkpoints.save_best(step))
        target = self.config.target_accuracy
        if target is None or result.accuracy < target:
            return False
        outputs.event("target_reached", step=step, target=target, accuracy=result.accuracy,
                      seconds_since_start=phase_done("target_reached"))
        return True

    def test(self, step: int, world: World) -> float:
        """Test accuracy over every rank's share of the test set."""
        with self.supervisor.guarded(step, "the test evaluation"):
            return self.on("test", world).accuracy

    def on(self, split: str, world: World) -> Evaluation:
        """The replica evaluated on this rank's batches of the "validation" or "test" split."""
        key = (split, world.rank, world.size)
        if key not in self._batches:
            self._batches[key] = eval_batches(getattr(self.data, split), self.config.eval_batch_size, world.rank,
                                              world.size)
        return self.replica.evaluate(self._batches[key])
