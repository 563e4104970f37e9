"""What every benchmark worker shares: its flags, the in-memory data, the step timer and the result file.

Workers are started by scripts/benchmark.py (directly, through horovodrun or mpirun, or as N local processes
that read BENCH_RANK, BENCH_WORLD_SIZE and BENCH_PORTS), through started.py, and write one small JSON result
holding where their time went (PHASES). Given
--validation-data, --eval-every and --target-accuracy, a training worker races to the target as hvd_mnist does
(TargetRace) and stops there.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hvd_mnist.runtime.boot.process import seconds_since_start

HIDDEN = 500
INIT_STDDEV = 0.1


@dataclass(frozen=True)
class LocalWorld:
    """This process's place among the N local processes that the benchmark spawned itself."""

    rank: int
    size: int
    ports: list[int]

    @classmethod
    def from_env(cls) -> LocalWorld:
        ports = [int(port) for port in os.environ.get("BENCH_PORTS", "").split(",") if port]
        return cls(int(os.environ.get("BENCH_RANK", "0")), int(os.environ.get("BENCH_WORLD_SIZE", "1")), ports)


@dataclass
class Phases:
    """Where a worker's time went: marks in seconds since its process started, named as the benchmark's phases
    (bench/phases.py) expect, and the seconds spent validating while training."""

    marks: dict[str, float] = field(default_factory=dict)
    evaluation_seconds: float = 0.0

    def done(self, mark: str) -> None:
        self.marks.setdefault(mark, round(seconds_since_start(), 3))

    def record(self) -> dict[str, object]:
        return {"started_at": round(time.time() - seconds_since_start(), 3), "phases": dict(self.marks),
                "evaluation_seconds": round(self.evaluation_seconds, 3)}


PHASES = Phases()  # started.py marks "interpreter"; parse_args, StepTimer, TargetRace and the workers the rest


def parse_args(description: str) -> argparse.Namespace:
    """The flags every training worker takes; called first in main, once the framework is imported."""
    PHASES.done("framework_imported")
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", required=True, help="npz with uint8 images [N, 784] and int64 labels [N]")
    parser.add_argument("--test-data", help="npz to report test accuracy on at the end (rank 0)")
    parser.add_argument("--batch-size", type=int, default=100, help="per worker")
    parser.add_argument("--steps", type=int, default=300, help="all steps, warm-up included")
    parser.add_argument("--warmup-steps", type=int, default=60, help="steps not timed (tracing, first batches)")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--threads", type=int, default=0, help="compute threads per worker (0: framework default)")
    parser.add_argument("--out", required=True, help="result JSON (written by rank 0)")
    parser.add_argument("--validation-data", help="npz held out of --data, evaluated every --eval-every steps")
    parser.add_argument("--eval-every", type=int, default=0, help="steps between validations (0: none)")
    parser.add_argument("--target-accuracy", type=float, help="stop once the validation accuracy reaches this")
    args = parser.parse_args()
    if (args.eval_every > 0 or args.target_accuracy is not None) and not args.validation_data:
        parser.error("--eval-every and --target-accuracy need --validation-data")
    if args.target_accuracy is not None and args.eval_every <= 0:
        parser.error("--target-accuracy needs --eval-every N (how often to evaluate)")
    return args


def load_npz(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images [N, 784], int64 labels [N]) from the benchmark's npz copy of the TFRecords."""
    with np.load(path) as data:
        return data["images"], data["labels"]


def scaled(images: np.ndarray) -> np.ndarray:
    """uint8 pixels to float32 in [0, 1], as hvd_mnist does."""
    return images.astype(np.float32) / 255.0


@dataclass
class StepTimer:
    """Times the steps after the warm-up: call tick() after every step, with a host sync where it matters."""

    warmup_steps: int
    steps: int = 0
    _start: float = field(default=0.0, repr=False)

    def tick(self) -> None:
        self.steps += 1
        if self.steps == 1:
            PHASES.done("first_step")
        if self.steps == self.warmup_steps:
            self._start = time.perf_counter()

    def timed(self) -> tuple[int, float]:
        """(timed steps, their seconds)."""
        if self.steps <= self.warmup_steps:
            raise RuntimeError(f"only {self.steps} steps ran, not more than the {self.warmup_steps} warm-up steps")
        return self.steps - self.warmup_steps, time.perf_counter() - self._start


@dataclass
class TargetRace:
    """hvd_mnist's --eval-every/--target-accuracy for a peer, so that both race by the same rule.

    Every `every` steps each rank counts the correct predictions on its shard of the validation split (every
    size-th example from its rank, as hvd_mnist shards it) and one sum over the ranks gives the accuracy, the
    same on every rank, so all stop at the same step. Without --validation-data nothing is ever due.
    """

    every: int = 0
    target: float | None = None
    images: np.ndarray | None = None  # this rank's shard of the validation split
    labels: np.ndarray | None = None
    evaluations: list[dict] = field(default_factory=list)
    reached: dict | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, rank: int, size: int) -> TargetRace:
        if not args.validation_data:
            return cls()
        images, labels = load_npz(args.validation_data)
        return cls(args.eval_every, args.target_accuracy, images[rank::size], labels[rank::size])

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def reaches_target(self, step: int, count_correct: Callable[[np.ndarray, np.ndarray], int],
                       sum_over_ranks: Callable[[list[float]], list[float]]) -> bool:
        """Evaluate after `step` steps (every rank, together); True once the accuracy is at the target."""
        started = time.perf_counter()
        correct, examples = sum_over_ranks([float(count_correct(self.images, self.labels)), float(len(self.labels))])
        PHASES.evaluation_seconds += time.perf_counter() - started
        accuracy = correct / max(examples, 1.0)
        self.evaluations.append({"step": step, "accuracy": accuracy})
        if self.target is None or accuracy < self.target:
            return False
        # Seconds since this worker process started, as hvd_mnist's target_reached event counts them.
        self.reached = {"steps_to_target": step, "seconds_to_target": seconds_since_start()}
        return True

    def record(self) -> dict[str, object]:
        """For the result file: the validation accuracy at the stop, when the target was reached, every evaluation."""
        if not self.evaluations:
            return {}
        return {"validation_accuracy": self.evaluations[-1]["accuracy"], **(self.reached or {}),
                "evaluations": self.evaluations}


def write_result(path: str, **fields: object) -> None:
    """The worker's JSON result."""
    Path(path).write_text(json.dumps(fields, default=float, indent=2) + "\n")


def write_throughput(path: str, timer: StepTimer, global_batch: int, race: TargetRace | None = None,
                     **extra: object) -> None:
    """Global examples/sec and sec/batch over the timed steps, the steps run, the race's record (if any) and
    whatever else the worker reports, and its phases (the test is over by now). A race that reached its target
    within the warm-up has no throughput."""
    PHASES.done("tested")
    timed = {}
    if timer.steps > timer.warmup_steps or not (race and race.reached):
        steps, seconds = timer.timed()
        timed = {"examples_per_sec": global_batch * steps / seconds, "sec_per_batch": seconds / steps,
                 "timed_steps": steps}
    write_result(path, **timed, global_batch=global_batch, steps=timer.steps, **(race.record() if race else {}),
                 **extra, **PHASES.record())
