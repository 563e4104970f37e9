"""The time-to-accuracy race: hvd_mnist np=2 against the fastest peer, to a validation accuracy on Fashion-MNIST.

Throughput alone does not show whether hvd_mnist gets a model trained sooner; the race does, on wall time from
launch to exit, with both racers validating on the same held-out examples.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from bench.configs import HVD_NP2, Config, plan_for, read_result, trainer_events
from bench.launching import BenchmarkError
from bench.report import fmt
from bench.runs import prepare_data, run_config, save_npz
from bench.stats import Summary, best_peer, median, ratio

TTA_BATCH = 100  # per worker, np=2; the contenders are also picked by their throughput at this batch
TTA_VALIDATION = 5000  # hvd_mnist's default hold-out for 60k training examples, passed to both racers
TTA_SEED = 0  # hvd_mnist's default --seed, which chooses the held-out examples


def time_to_accuracy(args: argparse.Namespace, configs: list[Config], summary: Summary, isolate: bool) -> dict:
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
    save_npz(data_dir / "race_train.npz", held.train.images, held.train.labels)
    save_npz(data_dir / "validation.npz", held.validation.images, held.validation.labels)
    return data_dir / "race_train.npz", data_dir / "validation.npz"


def race_possible(configs: list[Config]) -> bool:
    """Whether the selected configurations hold an hvd_mnist np=2 launch and a peer to pick the racers from."""
    return any(c.key in HVD_NP2 for c in configs) and any(c.group == "peer" for c in configs)


def race_contenders(summary: Summary, configs: list[Config]) -> dict[str, Config | None]:
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
