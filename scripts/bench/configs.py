"""What the benchmark runs: every configuration, the argv each job gets, and how its figures are read back.

A configuration is data (a Config) so that the table, the chart, results.json and the race all walk one list.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .launching import PEERS, BenchmarkError

CORES = os.cpu_count() or 1
HVD_NP2 = ("hvd_np2_gloo", "hvd_np2_mpirun")  # hvd_mnist np=2 under each launcher
KERAS_FIT = "peer_keras_fit"  # Keras 3 fit on hvd_mnist.keras


@dataclass(frozen=True)
class Plan:
    """What every job of one measurement gets: data, step counts, learning rate, limits."""

    train_records: Path
    train_npz: Path
    test_records: Path | None = None
    test_npz: Path | None = None
    steps: int = 300
    lr: float = 0.001
    timeout: int = 300
    isolate: bool = False
    gpu: bool = False

    @property
    def warmup(self) -> int:
        """Steps excluded from timing: the first fifth (tracing, first batches)."""
        return max(1, self.steps // 5)


ArgvBuilder = Callable[[Plan, int, Path, int], list[str]]  # (plan, batch, run dir, threads) -> args after python


@dataclass(frozen=True)
class Config:
    """One configuration: how to launch it and how to read its figures from its run directory."""

    key: str
    label: str
    group: str  # floor | hvd_mnist | peer | pipeline | allreduce
    launcher: str  # python | gloo | mpirun | local
    np_: int
    argv: ArgvBuilder
    read: Callable[[Path], dict[str, float]]
    per_batch: bool = True
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # set for its processes


def plan_for(prefix: Path, test_prefix: Path | None = None, **settings: Any) -> Plan:
    """A plan reading PREFIX.tfrecords / PREFIX.npz (and the test split's when given)."""
    test = {} if test_prefix is None else {"test_records": test_prefix.with_suffix(".tfrecords"),
                                           "test_npz": test_prefix.with_suffix(".npz")}
    return Plan(prefix.with_suffix(".tfrecords"), prefix.with_suffix(".npz"), **test, **settings)


# ---------------------------------------------------------------------------------------------- argv builders

def trainer_args(plan: Plan, batch: int, run_dir: Path, _threads: int) -> list[str]:
    """The real CLI on TFRecords; summaries, histograms and checkpoints only at the last step (not timed)."""
    args = ["-m", "hvd_mnist", "--train-records", str(plan.train_records), "--batch-size", str(batch),
            "--steps", str(plan.steps), "--log-every", str(plan.warmup), "--lr", str(plan.lr),
            "--summary-every", str(plan.steps), "--histogram-every", str(plan.steps),
            "--checkpoint-every", str(plan.steps), "--output-dir", str(run_dir / "run"), "--overwrite"]
    return args + (["--test-records", str(plan.test_records)] if plan.test_records else [])


def peer_args(script: str) -> ArgvBuilder:
    """argv builder for a worker script under scripts/peers taking common.parse_args's flags, run through
    started.py, which marks when the interpreter was up (the first of the worker's phases)."""

    def build(plan: Plan, batch: int, run_dir: Path, threads: int) -> list[str]:
        args = [str(PEERS / "started.py"), str(PEERS / script), "--data", str(plan.train_npz),
                "--batch-size", str(batch), "--steps", str(plan.steps), "--warmup-steps", str(plan.warmup),
                "--lr", str(plan.lr), "--threads", str(threads), "--out", str(run_dir / "result.json")]
        return args + (["--test-data", str(plan.test_npz)] if plan.test_npz else [])

    return build


def one_core_floor_args(plan: Plan, batch: int, run_dir: Path, _threads: int) -> list[str]:
    """The floor on one thread (its launcher holds it to one core): what one rank of np=2 has to work with."""
    return peer_args("floor.py")(plan, batch, run_dir, 1)


def pipeline_args(plan: Plan, batch: int, run_dir: Path, _threads: int) -> list[str]:
    """The input pipeline alone, on the trainer's TFRecords."""
    return [str(PEERS / "pipeline_only.py"), "--records", str(plan.train_records), "--batch-size", str(batch),
            "--steps", str(plan.steps), "--warmup-steps", str(plan.warmup), "--out", str(run_dir / "result.json")]


def allreduce_args(plan: Plan, _batch: int, run_dir: Path, _threads: int) -> list[str]:
    """The gradient's allreduce alone: one call per step, no batch."""
    return [str(PEERS / "allreduce.py"), "--calls", str(plan.steps), "--warmup-calls", str(plan.warmup),
            "--out", str(run_dir / "result.json")]


# ---------------------------------------------------------------------------------------------- readers

def read_result(run_dir: Path) -> dict[str, float]:
    """The numeric fields of a worker's result.json."""
    result = json.loads((run_dir / "result.json").read_text())
    return {key: value for key, value in result.items()
            if isinstance(value, int | float) and not isinstance(value, bool)}


def trainer_events(run_dir: Path) -> list[dict]:
    """The events of hvd_mnist's metrics.jsonl in a run directory."""
    return [json.loads(line) for line in (run_dir / "run" / "metrics.jsonl").read_text().splitlines()]


def read_trainer_metrics(run_dir: Path) -> dict[str, float]:
    """Throughput over every logged interval but the first (tracing), and the final test accuracy if any."""
    events = trainer_events(run_dir)
    intervals = [event["sec_per_batch"] for event in events if event["event"] == "train"][1:]
    if not intervals:
        raise BenchmarkError(f"no timed interval in {run_dir / 'run' / 'metrics.jsonl'}")
    global_batch = next(event["global_batch"] for event in events if event["event"] == "start")
    sec_per_batch = statistics.fmean(intervals)
    figures = {"examples_per_sec": global_batch / sec_per_batch, "sec_per_batch": sec_per_batch}
    accuracy = events[-1].get("test_accuracy")
    return figures | ({"test_accuracy": accuracy} if accuracy is not None else {})


# ---------------------------------------------------------------------------------------------- the lists

def hvd_mnist(key: str, label: str, launcher: str, np_: int, *extra_args: str,
              env: tuple[tuple[str, str], ...] = ()) -> Config:
    """hvd_mnist's own CLI under a launcher, read from its metrics.jsonl."""
    return Config(key, label, "hvd_mnist", launcher, np_, trainer_args, read_trainer_metrics, extra_args=extra_args,
                  env=env)


def peer(key: str, label: str, launcher: str, script: str) -> Config:
    """A peer's worker script on two ranks."""
    return Config(key, label, "peer", launcher, 2, peer_args(script), read_result)


FLOOR = Config("floor", "compute floor (1 process, tf.function)", "floor", "python", 1, peer_args("floor.py"),
               read_result)
# The denominator of the true parallel efficiency: np=2 runs one rank per core, so 2 x this is what two ranks would
# do with no collective and no synchronisation at all.
FLOOR_ONE_CORE = Config("floor_1core", "compute floor on 1 core, 1 thread", "floor", "one-core", 1,
                        one_core_floor_args, read_result)


def cpu_configs() -> list[Config]:
    """Every configuration of the CPU benchmark, in table order."""
    return [
        FLOOR,
        FLOOR_ONE_CORE,
        hvd_mnist("hvd_np1", "hvd_mnist np=1 (horovodrun --gloo)", "gloo", 1),
        hvd_mnist("hvd_np1_1core", "hvd_mnist np=1 on 1 core", "one-core", 1),
        hvd_mnist("hvd_np2_gloo", "hvd_mnist np=2 (horovodrun --gloo)", "gloo", 2),
        # The flight recorder's cost: the same, with it off (docs/monitoring.md).
        hvd_mnist("hvd_np2_gloo_unrecorded", "hvd_mnist np=2 (gloo), recorder off", "gloo", 2,
                  env=(("HVD_MNIST_FLIGHT_RECORDER", "0"),)),
        hvd_mnist("hvd_np2_mpirun", "hvd_mnist np=2 (mpirun)", "mpirun", 2),
        peer("peer_mwms", "peer: TF MultiWorkerMirrored np=2", "local", "mwms.py"),
        peer("peer_hvd_example", "peer: Horovod TF2 example np=2", "gloo", "hvd_example.py"),
        peer("peer_torch_ddp", "peer: PyTorch DDP Gloo np=2", "local", "torch_ddp.py"),
        # Not a rival: what Keras 3 fit costs with hvd_mnist.keras, raced like a peer (examples/keras_fit.py).
        peer(KERAS_FIT, "peer: Keras 3 fit, hvd_mnist.keras np=2", "gloo", "keras_fit.py"),
        Config("pipeline", "input pipeline alone (per rank)", "pipeline", "python", 1, pipeline_args, read_result),
        Config("allreduce_gloo", "allreduce 1.59 MB, Gloo, 2 ranks", "allreduce", "gloo", 2, allreduce_args,
               read_result, per_batch=False),
        Config("allreduce_mpi", "allreduce 1.59 MB, MPI, 2 ranks", "allreduce", "mpirun", 2, allreduce_args,
               read_result, per_batch=False),
    ]


def gpu_configs() -> list[Config]:
    """The GPU variant: the floor and hvd_mnist np=1 on one GPU, mixed precision off and on."""
    return [
        FLOOR,
        hvd_mnist("hvd_np1", "hvd_mnist np=1, float32", "python", 1),
        hvd_mnist("hvd_np1_mixed", "hvd_mnist np=1, --mixed-precision", "python", 1, "--mixed-precision"),
    ]
