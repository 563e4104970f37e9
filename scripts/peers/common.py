"""What every benchmark worker shares: its flags, the in-memory data, the step timer and the result file.

Workers are started by scripts/benchmark.py (directly, through horovodrun or mpirun, or as N local processes
that read BENCH_RANK, BENCH_WORLD_SIZE and BENCH_PORTS) and write one small JSON result.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

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


def parse_args(description: str) -> argparse.Namespace:
    """The flags every training worker takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", required=True, help="npz with uint8 images [N, 784] and int64 labels [N]")
    parser.add_argument("--test-data", help="npz to report test accuracy on at the end (rank 0)")
    parser.add_argument("--batch-size", type=int, default=100, help="per worker")
    parser.add_argument("--steps", type=int, default=300, help="all steps, warm-up included")
    parser.add_argument("--warmup-steps", type=int, default=60, help="steps not timed (tracing, first batches)")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--threads", type=int, default=0, help="compute threads per worker (0: framework default)")
    parser.add_argument("--out", required=True, help="result JSON (written by rank 0)")
    return parser.parse_args()


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
        if self.steps == self.warmup_steps:
            self._start = time.perf_counter()

    def timed(self) -> tuple[int, float]:
        """(timed steps, their seconds)."""
        if self.steps <= self.warmup_steps:
            raise RuntimeError(f"only {self.steps} steps ran, not more than the {self.warmup_steps} warm-up steps")
        return self.steps - self.warmup_steps, time.perf_counter() - self._start


def write_result(path: str, **fields: object) -> None:
    """The worker's JSON result."""
    Path(path).write_text(json.dumps(fields, default=float, indent=2) + "\n")


def write_throughput(path: str, timer: StepTimer, global_batch: int, **extra: object) -> None:
    """Global examples/sec and sec/batch over the timed steps, plus whatever else the worker reports."""
    steps, seconds = timer.timed()
    write_result(path, examples_per_sec=global_batch * steps / seconds, sec_per_batch=seconds / steps,
                 timed_steps=steps, global_batch=global_batch, **extra)
