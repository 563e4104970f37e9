"""Running the configurations: the data every job reads, one launch of one configuration, and the interleaved
repeats of them all."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from .configs import CORES, Config, Plan
from .launching import BenchmarkError, launch


def prepare_data(out_dir: Path, dataset: str, timeout: int) -> tuple[Path, Path]:
    """TFRecords through hvd_mnist's converter, once, plus an npz copy for the peers: the (train, test) prefixes."""
    data_dir = out_dir / "data" / dataset
    convert = ["-m", "hvd_mnist.data", "convert", "--dataset", dataset, "--out-dir", str(data_dir)]
    launch("python", 1, convert, data_dir, timeout=timeout)
    from hvd_mnist.runtime.boot.startup import import_tensorflow_quietly

    import_tensorflow_quietly()  # no TensorFlow start-up lines in the benchmark's own output
    from hvd_mnist.data.records import read_records

    for split in ("train", "test"):
        examples = read_records([str(data_dir / f"{split}.tfrecords")])
        save_npz(data_dir / f"{split}.npz", examples.images, examples.labels)
    return data_dir / "train", data_dir / "test"


def save_npz(path: Path, images: object, labels: object) -> None:
    """The peers' input format (numpy imported here: not needed until data exists)."""
    import numpy as np

    np.savez(path, images=images, labels=labels)


def run_config(plan: Plan, config: Config, batch: int, run_dir: Path) -> dict:
    """Launch one configuration once, in an empty run directory; its record (figures and wall time, or the error).

    A run directory left by an earlier benchmark into the same --out is removed first: its result.json would be
    read as this run's if this one wrote none, and PyTorch's file store in it sends DDP's ranks to the old
    run's ports ("Connection refused").
    """
    shutil.rmtree(run_dir, ignore_errors=True)
    threads = max(1, CORES // config.np_) if config.np_ > 1 else 0
    argv = [*config.argv(plan, batch, run_dir, threads), *config.extra_args]
    record = {"config": config.key, "batch_size": batch if config.per_batch else None, "launched_at": time.time()}
    try:
        record["wall_s"] = launch(config.launcher, config.np_, argv, run_dir, timeout=plan.timeout,
                                  isolate=plan.isolate, gpu=plan.gpu, env=dict(config.env))
        record["figures"] = config.read(run_dir)
    except (BenchmarkError, OSError, ValueError, KeyError) as err:
        record["error"] = str(err)
    return record


def measure(plan: Plan, configs: list[Config], batches: list[int], repeats: int, runs_dir: Path) -> list[dict]:
    """Every configuration, every batch, `repeats` times, interleaved so that drifting load hits all alike."""
    records = []
    for repeat in range(repeats):
        for config in configs:
            for batch in batches if config.per_batch else [None]:
                run_dir = runs_dir / f"{config.key}-b{batch or 'any'}-r{repeat}"
                record = run_config(plan, config, batch or 0, run_dir) | {"repeat": repeat}
                records.append(record)
                figures = record.get("figures", {})
                shown = (f"{figures['examples_per_sec']:,.0f} examples/s" if "examples_per_sec" in figures
                         else f"{figures.get('sec_per_call', 0) * 1000:.2f} ms/call")
                print(f"[{repeat + 1}/{repeats}] {config.key} batch {batch or '-'}: "
                      f"{record.get('error') or shown} ({record.get('wall_s', 0):.1f}s)", flush=True)
    return records
