"""Measure hvd_mnist against its peers and the compute floor, side by side, in one invocation.

    .venv/bin/python scripts/benchmark.py [--out bench_out/] [--repeats 3] [--steps 300] [--quick]
                                          [--time-to-accuracy [--tta-target 0.85] [--tta-eval-every 50]
                                           [--tta-max-steps 3000] [--tta-lr 0.1]] [--gpu]

Converts the offline MNIST sample to TFRecords (and an npz copy for the peers) once, then runs every
configuration `--repeats` times, interleaved, at per-worker batches 100 and 1000, with the first fifth of
the steps excluded as warm-up. Every job runs under a time limit; multi-process jobs run in a private
network namespace holding only the loopback interface when `unshare --net` works here. Writes
OUT/results.json (every raw figure, medians, spreads, ratios, targets, machine and versions) and
OUT/chart.png, and prints a table. See docs/benchmark.md.

--time-to-accuracy then races, on Fashion-MNIST at per-worker batch 100 and np=2, hvd_mnist (the faster
launcher at batch 100) against the fastest peer at batch 100. Each is launched once, holds out the same
5,000 training examples (hvd_mnist's own hold-out, seed 0) and trains on the rest, evaluates on them every
--tta-eval-every steps, and stops when its validation accuracy reaches --tta-target (or at --tta-max-steps);
the race is decided on wall time from launch to exit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bench.launching import BIN, launcher_env

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "scripts" / "peers"
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
CORES = os.cpu_count() or 1
HVD_NP2 = ("hvd_np2_gloo", "hvd_np2_mpirun")  # hvd_mnist np=2 under each launcher
NETNS_PREFIX = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']
TTA_BATCH = 100  # per worker, np=2; the contenders are also picked by their throughput at this batch
TTA_VALIDATION = 5000  # hvd_mnist's default hold-out for 60k training examples, passed to both racers
TTA_SEED = 0  # hvd_mnist's default --seed, which chooses the held-out examples
LIBRARIES = ("tensorflow-cpu", "horovod", "torch", "numpy", "mpi4py", "matplotlib")


class BenchmarkError(RuntimeError):
    """A job failed or ran past its time limit."""


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


@dataclass(frozen=True)
class Config:
    """One configuration: how to launch it and how to read its figures from its run directory."""

    key: str
    label: str
    group: str  # floor | hvd_mnist | peer | pipeline | allreduce
    launcher: str  # python | gloo | mpirun | local
    np_: int
    argv: Callable[[Plan, int, Path, int], list[str]]  # (plan, batch, run dir, threads) -> args after python
    read: Callable[[Path], dict[str, float]]
    per_batch: bool = True
    extra_args: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------- launching

def launcher_prefix(launcher: str, np_: int) -> list[str]:
    """argv that starts np_ copies of what follows it."""
    if launcher == "python":
        return []
    if launcher == "gloo":
        return [str(BIN / "horovodrun"), "--gloo", "-np", str(np_), "-H", f"localhost:{np_}"]
    if launcher == "mpirun":
        return ["mpirun", "--allow-run-as-root", "-np", str(np_), "--bind-to", "none"]
    if launcher == "local":
        return [sys.executable, str(PEERS / "local_workers.py"), "--np", str(np_), "--"]
    raise ValueError(launcher)


def network_namespace_works() -> bool:
    """True when `unshare --net` can give jobs a loopback-only network here (root or user namespaces)."""
    try:
        probe = subprocess.run([*NETNS_PREFIX, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def launch(plan: Plan, launcher: str, np_: int, argv: list[str], run_dir: Path) -> float:
    """Run one job to completion within plan.timeout, its output in run_dir/log.txt; its wall seconds."""
    command = [*launcher_prefix(launcher, np_), sys.executable, *argv]
    if plan.isolate and np_ > 1:
        command = [*NETNS_PREFIX, *command]
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "log.txt"
    start = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=launcher_env(plan.gpu, gloo_loopback=True), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=plan.timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_group(proc)
    if code is None:
        raise BenchmarkError(f"ran past {plan.timeout}s (log: {log_path})")
    if code != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
        raise BenchmarkError(f"exit {code}: {tail[0] if tail else ''} (log: {log_path})")
    return time.perf_counter() - start


def _kill_group(proc: subprocess.Popen) -> None:
    """End the job's process group (the launcher's children included), then reap the launcher."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# ---------------------------------------------------------------------------------------------- configurations

def trainer_args(plan: Plan, batch: int, run_dir: Path, _threads: int) -> list[str]:
    """The real CLI on TFRecords; summaries, histograms and checkpoints only at the last step (not timed)."""
    args = ["-m", "hvd_mnist", "--train-records", str(plan.train_records), "--batch-size", str(batch),
            "--steps", str(plan.steps), "--log-every", str(plan.warmup), "--lr", str(plan.lr),
            "--summary-every", str(plan.steps), "--histogram-every", str(plan.steps),
            "--checkpoint-every", str(plan.steps), "--output-dir", str(run_dir / "run"), "--overwrite"]
    return args + (["--test-records", str(plan.test_records)] if plan.test_records else [])


def peer_args(script: str) -> Callable[[Plan, int, Path, int], list[str]]:
    """argv builder for a worker script under scripts/peers taking common.parse_args's flags."""

    def build(plan: Plan, batch: int, run_dir: Path, threads: int) -> list[str]:
        args = [str(PEERS / script), "--data", str(plan.train_npz), "--batch-size", str(batch),
                "--steps", str(plan.steps), "--warmup-steps", str(plan.warmup), "--lr", str(plan.lr),
                "--threads", str(threads), "--out", str(run_dir / "result.json")]
        return args + (["--test-data", str(plan.test_npz)] if plan.test_npz else [])

    return build


def pipeline_args(plan: Plan, batch: int, run_dir: Path, _threads: int) -> list[str]:
    return [str(PEERS / "pipeline_only.py"), "--records", str(plan.train_records), "--batch-size", str(batch),
            "--steps", str(plan.steps), "--warmup-steps", str(plan.warmup), "--out", str(run_dir / "result.json")]


def allreduce_args(plan: Plan, _batch: int, run_dir: Path, _threads: int) -> list[str]:
    return [str(PEERS / "allreduce.py"), "--calls", str(plan.steps), "--warmup-calls", str(plan.warmup),
            "--out", str(run_dir / "result.json")]


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


def cpu_configs() -> list[Config]:
    """Every configuration of the CPU benchmark, in table order."""
    return [
        Config("floor", "compute floor (1 process, tf.function)", "floor", "python", 1,
               peer_args("floor.py"), read_result),
        Config("hvd_np1", "hvd_mnist np=1 (horovodrun --gloo)", "hvd_mnist", "gloo", 1, trainer_args,
               read_trainer_metrics),
        Config("hvd_np2_gloo", "hvd_mnist np=2 (horovodrun --gloo)", "hvd_mnist", "gloo", 2, trainer_args,
               read_trainer_metrics),
        Config("hvd_np2_mpirun", "hvd_mnist np=2 (mpirun)", "hvd_mnist", "mpirun", 2, trainer_args,
               read_trainer_metrics),
        Config("peer_mwms", "peer: TF MultiWorkerMirrored np=2", "peer", "local", 2, peer_args("mwms.py"),
               read_result),
        Config("peer_hvd_example", "peer: Horovod TF2 example np=2", "peer", "gloo", 2,
               peer_args("hvd_example.py"), read_result),
        Config("peer_torch_ddp", "peer: PyTorch DDP Gloo np=2", "peer", "local", 2, peer_args("torch_ddp.py"),
               read_result),
        Config("pipeline", "input pipeline alone (per rank)", "pipeline", "python", 1, pipeline_args, read_result),
        Config("allreduce_gloo", "allreduce 1.59 MB, Gloo, 2 ranks", "allreduce", "gloo", 2, allreduce_args,
               read_result, per_batch=False),
        Config("allreduce_mpi", "allreduce 1.59 MB, MPI, 2 ranks", "allreduce", "mpirun", 2, allreduce_args,
               read_result, per_batch=False),
    ]


def gpu_configs() -> list[Config]:
    """The GPU variant: the floor and hvd_mnist np=1 on one GPU, mixed precision off and on."""
    return [
        Config("floor", "compute floor (1 process, tf.function)", "floor", "python", 1,
               peer_args("floor.py"), read_result),
        Config("hvd_np1", "hvd_mnist np=1, float32", "hvd_mnist", "python", 1, trainer_args, read_trainer_metrics),
        Config("hvd_np1_mixed", "hvd_mnist np=1, --mixed-precision", "hvd_mnist", "python", 1,
               trainer_args, read_trainer_metrics, extra_args=("--mixed-precision",)),
    ]


def run_config(plan: Plan, config: Config, batch: int, run_dir: Path) -> dict:
    """Launch one configuration once; its record (figures and wall time, or the error)."""
    threads = max(1, CORES // config.np_) if config.np_ > 1 else 0
    argv = [*config.argv(plan, batch, run_dir, threads), *config.extra_args]
    record = {"config": config.key, "batch_size": batch if config.per_batch else None}
    try:
        record["wall_s"] = launch(plan, config.launcher, config.np_, argv, run_dir)
        record["figures"] = config.read(run_dir)
    except (BenchmarkError, OSError, ValueError, KeyError) as err:
        record["error"] = str(err)
    return record


# ---------------------------------------------------------------------------------------------- data

def prepare_data(out_dir: Path, dataset: str, timeout: int) -> tuple[Path, Path]:
    """TFRecords through hvd_mnist's converter, once, plus an npz copy for the peers; the data directory."""
    data_dir = out_dir / "data" / dataset
    convert = ["-m", "hvd_mnist.data", "convert", "--dataset", dataset, "--out-dir", str(data_dir)]
    launch(Plan(Path(), Path(), timeout=timeout), "python", 1, convert, data_dir)
    from hvd_mnist.runtime.startup import import_tensorflow_quietly

    import_tensorflow_quietly()  # no TensorFlow start-up lines in the benchmark's own output
    from hvd_mnist.data.records import read_records

    for split in ("train", "test"):
        examples = read_records([str(data_dir / f"{split}.tfrecords")])
        _save_npz(data_dir / f"{split}.npz", examples.images, examples.labels)
    return data_dir / "train", data_dir / "test"


def _save_npz(path: Path, images, labels) -> None:
    import numpy as np

    np.savez(path, images=images, labels=labels)


def plan_for(prefix: Path, test_prefix: Path | None = None, **settings) -> Plan:
    """A plan reading PREFIX.tfrecords / PREFIX.npz (and the test split's when given)."""
    test = {} if test_prefix is None else {"test_records": test_prefix.with_suffix(".tfrecords"),
                                           "test_npz": test_prefix.with_suffix(".npz")}
    return Plan(prefix.with_suffix(".tfrecords"), prefix.with_suffix(".npz"), **test, **settings)


# ---------------------------------------------------------------------------------------------- statistics

def summarize(records: list[dict]) -> dict:
    """Median, min and max of every figure, per configuration and batch size."""
    grouped: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        if "figures" in record:
            grouped.setdefault((record["config"], str(record["batch_size"] or "any")), []).append(record["figures"])
    summary: dict = {}
    for (config, batch), runs in grouped.items():
        stats = {name: {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
                 for name in runs[0] if len(values := [run[name] for run in runs if name in run]) == len(runs)}
        summary.setdefault(config, {})[batch] = stats
    return summary


def median(summary: dict, config: str, batch: int | str, figure: str = "examples_per_sec") -> float | None:
    """A configuration's median figure, or None where it did not run."""
    return summary.get(config, {}).get(str(batch), {}).get(figure, {}).get("median")


def best_peer(summary: dict, configs: list[Config], batch: int) -> tuple[str | None, float | None]:
    """The fastest peer at this batch: (key, examples/sec)."""
    rates = {c.key: rate for c in configs if c.group == "peer" and (rate := median(summary, c.key, batch))}
    if not rates:
        return None, None
    key = max(rates, key=rates.get)
    return key, rates[key]


def max_rate(summary: dict, keys: tuple[str, ...], batch: int) -> float | None:
    """The highest median examples/sec among these configurations at this batch (None if none ran)."""
    rates = [rate for key in keys if (rate := median(summary, key, batch)) is not None]
    return max(rates, default=None)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator and denominator else None


def derive(summary: dict, configs: list[Config], batches: list[int]) -> dict:
    """Scaling efficiency and ratios to the floor and best peer, per batch."""
    derived = {}
    for batch in batches:
        peer_key, peer_rate = best_peer(summary, configs, batch)
        floor = median(summary, "floor", batch)
        np1 = median(summary, "hvd_np1", batch)
        training_per_rank = ratio(max_rate(summary, HVD_NP2, batch), 2)
        derived[str(batch)] = {
            "best_peer": peer_key,
            "scaling_efficiency": {key: ratio(median(summary, key, batch), 2 * np1) if np1 else None
                                   for key in HVD_NP2},
            "throughput_vs_floor": {c.key: ratio(median(summary, c.key, batch), floor)
                                    for c in configs if c.per_batch and c.group != "pipeline"},
            "throughput_vs_best_peer": {c.key: ratio(median(summary, c.key, batch), peer_rate)
                                        for c in configs if c.per_batch and c.group != "pipeline"},
            "step_time_vs_floor": {c.key: ratio(median(summary, c.key, batch, "sec_per_batch"),
                                                median(summary, "floor", batch, "sec_per_batch"))
                                   for c in configs if c.per_batch and c.group != "pipeline"},
            "pipeline_vs_training_per_rank": ratio(median(summary, "pipeline", batch), training_per_rank),
        }
    return derived


def targets(summary: dict, derived: dict, configs: list[Config], batches: list[int], race: dict | None) -> dict:
    """The project's targets, each with the figures it was decided on (None: not measured)."""
    result = {}
    for batch in batches:
        _, peer_rate = best_peer(summary, configs, batch)
        for key in HVD_NP2:
            rate = median(summary, key, batch)
            result[f"{key}_beats_every_peer_b{batch}"] = {
                "met": None if rate is None or peer_rate is None else rate >= peer_rate,
                "hvd_mnist": rate, "best_peer": peer_rate}
        pipeline = derived[str(batch)]["pipeline_vs_training_per_rank"]
        result[f"pipeline_10x_training_b{batch}"] = {"met": None if pipeline is None else pipeline >= 10,
                                                    "ratio": pipeline}
    if 1000 in batches:
        step_ratio = derived["1000"]["step_time_vs_floor"].get("hvd_np1")
        result["hvd_np1_within_1.15x_floor_step_time_b1000"] = {
            "met": None if step_ratio is None else step_ratio <= 1.15, "ratio": step_ratio}
    result["time_to_accuracy_within_1.0x_best_peer"] = race_target(race)
    return result


# ---------------------------------------------------------------------------------------------- reporting

def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(summary: dict, derived: dict, configs: list[Config], batches: list[int]) -> str:
    """The stdout table: per batch, every configuration's median examples/sec, spread, step time and ratios."""
    lines = []
    header = (f"{'configuration':<42}{'examples/s':>12}{'spread (min..max)':>22}{'ms/step':>9}"
              f"{'x floor':>9}{'x best peer':>13}")
    for batch in batches:
        d = derived[str(batch)]
        lines += ["", f"per-worker batch {batch} (medians; best peer: {d['best_peer']})", header]
        for c in configs:
            stats = summary.get(c.key, {}).get(str(batch), {})
            if not c.per_batch or not stats:
                continue
            rate = stats["examples_per_sec"]
            vs_floor = "-" if c.group == "pipeline" else fmt(d["throughput_vs_floor"][c.key], ".2f")
            vs_peer = (f"{fmt(d['pipeline_vs_training_per_rank'], '.1f')}x trn" if c.group == "pipeline"
                       else fmt(d["throughput_vs_best_peer"][c.key], ".2f"))
            spread = f"{rate['min']:,.0f}..{rate['max']:,.0f}"
            lines.append(f"{c.label:<42}{rate['median']:>12,.0f}{spread:>22}"
                         f"{stats['sec_per_batch']['median'] * 1000:>9.2f}{vs_floor:>9}{vs_peer:>13}")
        efficiency = d["scaling_efficiency"]
        lines.append(f"scaling efficiency np=2/(2 x np=1): gloo {fmt(efficiency['hvd_np2_gloo'], '.2f')}, "
                     f"mpirun {fmt(efficiency['hvd_np2_mpirun'], '.2f')}")
    for c in configs:
        stats = summary.get(c.key, {}).get("any")
        if stats:
            call = {name: value * 1000 for name, value in stats["sec_per_call"].items() if name != "n"}
            bandwidth = stats["algbw_gbytes_per_sec"]["median"]
            lines.append(f"{c.label:<42}{call['median']:>8.2f} ms/call  {bandwidth:.2f} GB/s"
                         f"  (spread {call['min']:.2f}..{call['max']:.2f} ms)")
    return "\n".join(lines)


def chart(summary: dict, configs: list[Config], batches: list[int], path: Path) -> None:
    """Bar chart: examples/sec per training configuration per batch (min..max whiskers), allreduce ms/call."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    training = [c for c in configs if c.per_batch and c.group != "pipeline"]
    reducers = [c for c in configs if not c.per_batch and c.key in summary]
    panels = len(batches) + (1 if reducers else 0)
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.8), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=False):
        shown = [c for c in training if str(batch) in summary.get(c.key, {})]
        _bars(ax, [c.label for c in shown], [summary[c.key][str(batch)]["examples_per_sec"] for c in shown],
              [f"C{['floor', 'hvd_mnist', 'peer'].index(c.group)}" for c in shown])
        ax.set_title(f"per-worker batch {batch}: examples/sec (global)")
    if reducers:
        _bars(axes[0][-1], [c.label for c in reducers], [summary[c.key]["any"]["sec_per_call"] for c in reducers],
              ["C3"] * len(reducers))
        axes[0][-1].set_title("allreduce of the gradient: seconds/call")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _bars(ax, labels: list[str], stats: list[dict], colors: list[str]) -> None:
    medians = [s["median"] for s in stats]
    whiskers = [[m - s["min"] for m, s in zip(medians, stats, strict=True)],
                [s["max"] - m for m, s in zip(medians, stats, strict=True)]]
    ax.barh(range(len(labels)), medians, xerr=whiskers, color=colors, capsize=3)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()


def machine() -> dict:
    """Cores, Python and library versions."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"cores": CORES, "python": platform.python_version(), "platform": platform.platform(),
            "versions": versions}


# ---------------------------------------------------------------------------------------------- time to accuracy

def time_to_accuracy(args: argparse.Namespace, configs: list[Config], summary: dict, isolate: bool) -> dict:
    """Race hvd_mnist np=2 (the faster launcher at batch 100) against the fastest peer at batch 100, one run each,
    to --tta-target validation accuracy on full Fashion-MNIST; the figure is wall time from launch to exit.

    Every peer can race (common.TargetRace). Both evaluate the same held-out examples every --tta-eval-every
    steps, each rank its shard and one sum over the ranks; hvd_mnist evaluates its moving-average weights, the
    peers (which keep none) their weights as they are. Each then reports its test accuracy and exits.
    """
    train, test = prepare_data(args.out, "fashion_mnist", args.timeout)
    peer_train, validation = hold_out_for_peers(train.parent)
    # hvd_mnist reads every training record and holds the validation examples out itself; the peer gets the rest.
    plan = dataclasses.replace(plan_for(train, test, steps=args.tta_max_steps, lr=args.tta_lr, timeout=args.timeout,
                                        isolate=isolate), train_npz=peer_train)
    contenders = {}
    for role, config in race_contenders(summary, configs).items():
        if config is None:
            contenders[role] = {"error": f"no {role} configuration was measured at batch {TTA_BATCH}"}
            continue
        racer = dataclasses.replace(config, extra_args=(*config.extra_args, *race_args(config, args, validation)),
                                    read=read_trainer_race if config.group == "hvd_mnist" else read_result)
        contenders[role] = run_config(plan, racer, TTA_BATCH, args.out / "tta" / config.key)
        print(f"time-to-accuracy {config.key}: {race_line(contenders[role])}", flush=True)
    walls = [wall_to_target(contenders[role]) for role in ("hvd_mnist", "best_peer")]
    print(f"time-to-accuracy: hvd_mnist / best peer, launch to exit: {fmt(ratio(*walls), '.2f')}x", flush=True)
    return {"target_validation_accuracy": args.tta_target, "lr": args.tta_lr, "batch_size": TTA_BATCH,
            "dataset": "fashion_mnist", "eval_every": args.tta_eval_every, "max_steps": args.tta_max_steps,
            "validation_examples": TTA_VALIDATION, "validation_seed": TTA_SEED, "contenders": contenders,
            "hvd_over_peer_wall": ratio(*walls)}


def hold_out_for_peers(data_dir: Path) -> tuple[Path, Path]:
    """hvd_mnist's own validation hold-out applied to the training npz, so that the peer trains on the examples
    hvd_mnist trains on and validates on the ones it validates on: the (train, validation) npz files."""
    import numpy as np

    from hvd_mnist.data.sources import Dataset, Split, hold_out_validation

    with np.load(data_dir / "train.npz") as data:
        train = Split(data["images"], data["labels"])
    held = hold_out_validation(Dataset(train, None, "train.npz"), TTA_VALIDATION, TTA_SEED)
    _save_npz(data_dir / "race_train.npz", held.train.images, held.train.labels)
    _save_npz(data_dir / "validation.npz", held.validation.images, held.validation.labels)
    return data_dir / "race_train.npz", data_dir / "validation.npz"


def race_possible(configs: list[Config]) -> bool:
    """Whether the selected configurations hold an hvd_mnist np=2 launch and a peer to pick the racers from."""
    return any(c.key in HVD_NP2 for c in configs) and any(c.group == "peer" for c in configs)


def race_contenders(summary: dict, configs: list[Config]) -> dict[str, Config | None]:
    """The racers by role: the faster hvd_mnist np=2 launcher and the fastest peer at batch 100 (None: not measured)."""
    peer_key, _ = best_peer(summary, configs, TTA_BATCH)
    rates = {key: rate for key in HVD_NP2 if (rate := median(summary, key, TTA_BATCH))}
    hvd_key = max(rates, key=rates.get, default=None)
    by_key = {c.key: c for c in configs}
    return {"hvd_mnist": by_key.get(hvd_key), "best_peer": by_key.get(peer_key)}


def race_args(config: Config, args: argparse.Namespace, validation: Path) -> tuple[str, ...]:
    """The flags that stop a racer at the target: hvd_mnist's own (it holds the same examples out itself, by size
    and seed), or common.py's for a peer (handed those examples)."""
    race = ("--eval-every", str(args.tta_eval_every), "--target-accuracy", str(args.tta_target))
    if config.group == "hvd_mnist":
        return (*race, "--validation-size", str(TTA_VALIDATION), "--seed", str(TTA_SEED))
    return (*race, "--validation-data", str(validation))


def read_trainer_race(run_dir: Path) -> dict[str, float]:
    """hvd_mnist's race in the peers' terms, from its metrics.jsonl: steps run, validation accuracy at the stop,
    test accuracy, and, once the target was reached, the steps and in-process seconds it took."""
    events = trainer_events(run_dir)
    evaluations = [event for event in events if event["event"] == "eval"]
    ends = [event for event in events if event["event"] == "end"]
    if not evaluations or not ends:
        raise BenchmarkError(f"no evaluation or no end in {run_dir / 'run' / 'metrics.jsonl'}")
    figures = {"steps": ends[0]["step"], "validation_accuracy": evaluations[-1]["accuracy"],
               "test_accuracy": ends[0]["test_accuracy"]}
    for event in events:
        if event["event"] == "target_reached":
            figures |= {"steps_to_target": event["step"], "seconds_to_target": event["seconds_since_start"]}
    return figures


def wall_to_target(record: dict) -> float | None:
    """Launch-to-exit seconds of a racer that reached the target (None: it failed or stopped at the step cap)."""
    return record["wall_s"] if "steps_to_target" in record.get("figures", {}) else None


def race_target(race: dict | None) -> dict:
    """hvd_mnist within 1.0x the best peer's wall time to the target: met if it got there no later or only it got
    there, missed if only the peer got there or sooner; None if there was no race, a run failed or none got there."""
    contenders = (race or {}).get("contenders", {})
    hvd, peer = contenders.get("hvd_mnist", {}), contenders.get("best_peer", {})
    hvd_wall, peer_wall = wall_to_target(hvd), wall_to_target(peer)
    decided = "figures" in hvd and "figures" in peer and (hvd_wall is not None or peer_wall is not None)
    met = hvd_wall is not None and (peer_wall is None or hvd_wall <= peer_wall) if decided else None
    return {"met": met, "ratio": ratio(hvd_wall, peer_wall), "hvd_mnist_wall_s": hvd_wall,
            "best_peer_wall_s": peer_wall}


def race_line(record: dict) -> str:
    """One racer's outcome in a line."""
    if "error" in record:
        return f"failed: {record['error']}"
    figures = record["figures"]
    outcome = (f"reached the target at step {figures['steps_to_target']} "
               f"({figures['seconds_to_target']:.1f} s after its start)" if "steps_to_target" in figures
               else f"did not reach the target in {figures['steps']} steps")
    return (f"{outcome}, validation accuracy {figures['validation_accuracy']:.4f}, test accuracy "
            f"{fmt(figures.get('test_accuracy'), '.4f')}, {record['wall_s']:.1f} s launch to exit")


# ---------------------------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "bench_out", help="output folder (default: bench_out/)")
    parser.add_argument("--repeats", type=int, help="runs of each configuration (default 3; --quick: 1)")
    parser.add_argument("--steps", type=int, help="steps per run, the first fifth untimed (default 300; --quick: 100)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="per worker (default 100 1000; --quick: 100)")
    parser.add_argument("--quick", action="store_true", help="one short repeat at batch 100 (under 3 minutes)")
    parser.add_argument("--time-to-accuracy", action="store_true",
                        help="then race hvd_mnist np=2 against the best peer at batch 100 to --tta-target on "
                             "Fashion-MNIST, one run each, timed from launch to exit (needs batch 100)")
    parser.add_argument("--tta-target", type=float, default=0.85,
                        help="validation accuracy at which a racer stops (default 0.85)")
    parser.add_argument("--tta-eval-every", type=int, default=50,
                        help="steps between the racers' validations (default 50)")
    parser.add_argument("--tta-max-steps", type=int, default=3000,
                        help="steps after which a racer that has not reached the target stops (default 3000)")
    parser.add_argument("--tta-lr", type=float, default=0.1, help="learning rate of the racers (default 0.1)")
    parser.add_argument("--gpu", action="store_true", help="the GPU variant: np=1 on one GPU, mixed precision off/on")
    parser.add_argument("--timeout", type=int, default=300, help="seconds allowed to each job (default 300)")
    parser.add_argument("--only", nargs="+", metavar="KEY", default=[],
                        help="run only these configurations, by results.json key (e.g. floor hvd_np1)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.repeats = args.repeats or (1 if quick else 3)
    args.steps = args.steps or (100 if quick else 300)
    args.batch_sizes = args.batch_sizes or ([100] if quick else [100, 1000])
    if args.repeats < 1 or args.steps < 5 or min(args.batch_sizes) < 1:
        parser.error("--repeats, --batch-sizes must be positive and --steps at least 5")
    if quick and args.time_to_accuracy:
        parser.error("--time-to-accuracy is too long for --quick")
    if args.time_to_accuracy and TTA_BATCH not in args.batch_sizes:
        parser.error(f"--time-to-accuracy picks its racers by their throughput at batch {TTA_BATCH}: "
                     f"keep {TTA_BATCH} in --batch-sizes")
    if not 0 < args.tta_target <= 1 or not 1 <= args.tta_eval_every <= args.tta_max_steps:
        parser.error("--tta-target must be in (0, 1] and --tta-eval-every in 1..--tta-max-steps")
    args.out = args.out.resolve()
    return args


def gpu_present() -> bool:
    """True when TensorFlow in this environment sees a GPU (asked in a short-lived child process)."""
    probe = [sys.executable, "-c", "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"]
    try:
        found = subprocess.run(probe, capture_output=True, text=True, timeout=120, env=launcher_env(gpu=True))
    except subprocess.TimeoutExpired:
        return False
    last_line = found.stdout.strip().splitlines()[-1:] or ["0"]
    return found.returncode == 0 and last_line[0].isdigit() and int(last_line[0]) > 0


def measure(args: argparse.Namespace, configs: list[Config], isolate: bool) -> list[dict]:
    """Every configuration, every batch, `repeats` times, interleaved so that drifting load hits all alike."""
    train, _ = prepare_data(args.out, "mnist", args.timeout)
    plan = plan_for(train, steps=args.steps, timeout=args.timeout, isolate=isolate, gpu=args.gpu)
    records = []
    for repeat in range(args.repeats):
        for config in configs:
            for batch in args.batch_sizes if config.per_batch else [None]:
                run_dir = args.out / "runs" / f"{config.key}-b{batch or 'any'}-r{repeat}"
                record = run_config(plan, config, batch or 0, run_dir) | {"repeat": repeat}
                records.append(record)
                figures = record.get("figures", {})
                shown = (f"{figures['examples_per_sec']:,.0f} examples/s" if "examples_per_sec" in figures
                         else f"{figures.get('sec_per_call', 0) * 1000:.2f} ms/call")
                print(f"[{repeat + 1}/{args.repeats}] {config.key} batch {batch or '-'}: "
                      f"{record.get('error') or shown} ({record.get('wall_s', 0):.1f}s)", flush=True)
    return records


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.gpu and not gpu_present():
        print("benchmark: error: --gpu needs a GPU that TensorFlow can see, and none was found", file=sys.stderr)
        return 1
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    isolate = network_namespace_works()
    configs = gpu_configs() if args.gpu else cpu_configs()
    unknown = sorted(set(args.only) - {c.key for c in configs})
    if unknown:
        print(f"benchmark: error: unknown --only key(s) {', '.join(unknown)}; choose from "
              f"{', '.join(c.key for c in configs)}", file=sys.stderr)
        return 2
    configs = [c for c in configs if not args.only or c.key in args.only]
    racing = args.time_to_accuracy and not args.gpu
    if racing and not race_possible(configs):
        print(f"benchmark: error: --time-to-accuracy races the faster of {' and '.join(HVD_NP2)} against the "
              "fastest peer at batch 100: --only must name at least one of those and a peer", file=sys.stderr)
        return 2
    records = measure(args, configs, isolate)
    summary = summarize(records)
    derived = derive(summary, configs, args.batch_sizes)
    print(table(summary, derived, configs, args.batch_sizes), flush=True)
    race = time_to_accuracy(args, configs, summary, isolate) if racing else None
    results = {
        "machine": machine(),
        "settings": {"repeats": args.repeats, "steps": args.steps, "warmup_steps": max(1, args.steps // 5),
                     "batch_sizes": args.batch_sizes, "quick": args.quick, "gpu": args.gpu,
                     "loopback_only_network_namespace": isolate},
        "configs": {c.key: {"label": c.label, "group": c.group, "launcher": c.launcher, "np": c.np_}
                    for c in configs},
        "runs": records, "summary": summary, "derived": derived,
        "targets": {} if args.gpu else targets(summary, derived, configs, args.batch_sizes, race),
    }
    if race:
        results["time_to_accuracy"] = race
    results["duration_s"] = time.perf_counter() - started
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=float) + "\n")
    chart(summary, configs, args.batch_sizes, args.out / "chart.png")
    for name, target in results["targets"].items():
        print(f"target {name}: {'met' if target['met'] else 'MISSED' if target['met'] is False else 'not measured'}")
    failures = [record for record in [*records, *(race or {}).get("contenders", {}).values()] if "error" in record]
    print(f"wrote {args.out / 'results.json'} and {args.out / 'chart.png'} in {results['duration_s']:.0f}s"
          + (f"; {len(failures)} run(s) failed" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

