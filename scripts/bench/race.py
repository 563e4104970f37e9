"""The time-to-accuracy race: hvd_mnist np=2 against PyTorch DDP, Horovod's example and the fastest peer, to a
validation accuracy on Fashion-MNIST.

Throughput alone does not show whether hvd_mnist gets a model trained sooner; the race does, on wall time from
launch to exit, with both racers validating on the same held-out examples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from .configs import HVD_NP2, KERAS_FIT, Config, plan_for, read_result, trainer_events
from .launching import BenchmarkError
from .phases import HVD_MNIST_MARKS, durations
from .phases import table as phase_table
from .report import fmt
from .runs import prepare_data, run_config, save_npz
from .stats import Summary, best_peer, median, ratio

TTA_BATCH = 100  # per worker, np=2; the contenders are also picked by their throughput at this batch
TTA_VALIDATION = 5000  # hvd_mnist's default hold-out for 60k training examples, passed to both racers
TTA_SEED = 0  # hvd_mnist's default --seed, which chooses the held-out examples
# Always raced, whichever peer is fastest at batch 100, and hvd_mnist's targets: at most RIVAL_RATIO x their wall
# time from launch to exit.
RIVALS = ("peer_torch_ddp", "peer_hvd_example")
RIVAL_RATIO = 0.75


def time_to_accuracy(args: argparse.Namespace, configs: list[Config], summary: Summary, isolate: bool) -> dict:
    """Race hvd_mnist np=2 (the faster launcher at batch 100) against PyTorch DDP, Horovod's example and the
    fastest peer at batch 100, one run each, to --tta-target validation accuracy on full Fashion-MNIST; the
    figure is wall time from launch to exit, shown in phases (bench/phases.py).

    Every peer can race (common.TargetRace). All evaluate the same held-out examples every --tta-eval-every
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
                                    read=read_trainer_race if config.group == "hvd_mnist" else read_peer_race)
        record = run_config(plan, racer, TTA_BATCH, args.out / "tta" / config.key)
        if "figures" in record:
            figures = record["figures"]
            record["phases"] = durations(record["launched_at"], record["wall_s"], figures.pop("started_at"),
                                         figures.pop("phases"), figures.pop("evaluation_seconds", 0.0))
        contenders[role] = record
        print(f"time-to-accuracy {config.key}: {race_line(record)}", flush=True)
    print(phase_table({role: record["phases"] for role, record in contenders.items() if "phases" in record}),
          flush=True)
    walls = {role: wall_to_target(record) for role, record in contenders.items()}
    for role in contenders:
        if role != "hvd_mnist":
            print(f"time-to-accuracy: hvd_mnist / {role}, launch to exit: "
                  f"{fmt(ratio(walls['hvd_mnist'], walls[role]), '.2f')}x", flush=True)
    return {"target_validation_accuracy": args.tta_target, "lr": args.tta_lr, "batch_size": TTA_BATCH,
            "dataset": "fashion_mnist", "eval_every": args.tta_eval_every, "max_steps": args.tta_max_steps,
            "validation_examples": TTA_VALIDATION, "validation_seed": TTA_SEED,
            "best_peer": best_peer(summary, configs, TTA_BATCH)[0], "contenders": contenders}


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
    """The racers by role: "hvd_mnist" (the faster np=2 launcher at batch 100; None: not measured), each rival
    that was selected, and the fastest peer at batch 100 under its own key if it is not a rival."""
    peer_key, _ = best_peer(summary, configs, TTA_BATCH)
    rates = {key: rate for key in HVD_NP2 if (rate := median(summary, key, TTA_BATCH))}
    hvd_key = max(rates, key=rates.get, default=None)
    by_key = {c.key: c for c in configs}
    raced = (*RIVALS, KERAS_FIT)  # Keras fit races too, to show what it costs, but sets no target
    peers = [key for key in raced if key in by_key] + ([peer_key] if peer_key and peer_key not in raced else [])
    return {"hvd_mnist": by_key.get(hvd_key), **{key: by_key[key] for key in peers}}


def race_args(config: Config, args: argparse.Namespace, validation: Path) -> tuple[str, ...]:
    """The flags that stop a racer at the target: hvd_mnist's own (it holds the same examples out itself, by size
    and seed), or common.py's for a peer (handed those examples)."""
    race = ("--eval-every", str(args.tta_eval_every), "--target-accuracy", str(args.tta_target))
    if config.group == "hvd_mnist":
        return (*race, "--validation-size", str(TTA_VALIDATION), "--seed", str(TTA_SEED))
    return (*race, "--validation-data", str(validation))


def read_trainer_race(run_dir: Path) -> dict:
    """hvd_mnist's race in the peers' terms, from its metrics.jsonl: steps run, validation accuracy at the stop,
    test accuracy, once the target was reached the steps and in-process seconds it took, and its phase marks
    under the benchmark's names."""
    events = trainer_events(run_dir)
    evaluations = [event for event in events if event["event"] == "eval"]
    starts = [event for event in events if event["event"] == "start"]
    ends = [event for event in events if event["event"] == "end"]
    if not evaluations or not starts or not ends:
        raise BenchmarkError(f"no evaluation, start or end in {run_dir / 'run' / 'metrics.jsonl'}")
    figures = {"steps": ends[0]["step"], "validation_accuracy": evaluations[-1]["accuracy"],
               "test_accuracy": ends[0]["test_accuracy"], "started_at": starts[0]["started_at"],
               "phases": {HVD_MNIST_MARKS[name]: at for name, at in ends[0]["phases"].items()
                          if name in HVD_MNIST_MARKS},
               "evaluation_seconds": ends[0]["evaluation_seconds"]}
    for event in events:
        if event["event"] == "target_reached":
            figures |= {"steps_to_target": event["step"], "seconds_to_target": event["seconds_since_start"]}
    return figures


def read_peer_race(run_dir: Path) -> dict:
    """A peer's result.json: its figures, and the phase marks common.PHASES left."""
    result = json.loads((run_dir / "result.json").read_text())
    return read_result(run_dir) | {name: result[name] for name in ("started_at", "phases", "evaluation_seconds")}


def wall_to_target(record: dict) -> float | None:
    """Launch-to-exit seconds of a racer that reached the target (None: it failed or stopped at the step cap)."""
    return record["wall_s"] if "steps_to_target" in record.get("figures", {}) else None


def race_target(race: dict | None, rival: str, within: float = RIVAL_RATIO) -> dict:
    """hvd_mnist within `within` x a rival's wall time to the target: met if it got there in that time or only it
    got there, missed if only the rival got there or hvd_mnist took longer; None if there was no race, a run
    failed or none got there."""
    contenders = (race or {}).get("contenders", {})
    hvd, peer = contenders.get("hvd_mnist", {}), contenders.get(rival, {})
    hvd_wall, peer_wall = wall_to_target(hvd), wall_to_target(peer)
    decided = "figures" in hvd and "figures" in peer and (hvd_wall is not None or peer_wall is not None)
    met = hvd_wall is not None and (peer_wall is None or hvd_wall <= within * peer_wall) if decided else None
    return {"met": met, "ratio": ratio(hvd_wall, peer_wall), "hvd_mnist_wall_s": hvd_wall,
            "rival_wall_s": peer_wall}


def race_targets(race: dict | None) -> dict[str, dict]:
    """The race's targets in results.json: hvd_mnist within RIVAL_RATIO x each rival's wall time."""
    return {f"time_to_accuracy_within_{RIVAL_RATIO}x_{rival}": race_target(race, rival) for rival in RIVALS}


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
