"""From raw records to the figures the report and the targets are decided on.

Every mapping here is keyed by the per-worker batch as an int; None keys what runs once, not per batch (the
allreduce). Only report.write_results turns them into results.json's string keys.
"""

from __future__ import annotations

import statistics

from .configs import HVD_NP2, Config

Stats = dict[str, dict[str, float]]  # figure -> {"median", "min", "max", "n"}
Summary = dict[str, dict[int | None, Stats]]  # configuration key -> batch -> stats


def summarize(records: list[dict]) -> Summary:
    """Median, min and max of every figure, per configuration and batch size."""
    grouped: dict[tuple[str, int | None], list[dict]] = {}
    for record in records:
        if "figures" in record:
            grouped.setdefault((record["config"], record["batch_size"]), []).append(record["figures"])
    summary: Summary = {}
    for (config, batch), runs in grouped.items():
        stats = {name: {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
                 for name in runs[0] if len(values := [run[name] for run in runs if name in run]) == len(runs)}
        summary.setdefault(config, {})[batch] = stats
    return summary


def median(summary: Summary, config: str, batch: int | None, figure: str = "examples_per_sec") -> float | None:
    """A configuration's median figure, or None where it did not run."""
    return summary.get(config, {}).get(batch, {}).get(figure, {}).get("median")


def best_peer(summary: Summary, configs: list[Config], batch: int) -> tuple[str | None, float | None]:
    """The fastest peer at this batch: (key, examples/sec)."""
    rates = {c.key: rate for c in configs if c.group == "peer" and (rate := median(summary, c.key, batch))}
    if not rates:
        return None, None
    key = max(rates, key=rates.get)
    return key, rates[key]


def max_rate(summary: Summary, keys: tuple[str, ...], batch: int) -> float | None:
    """The highest median examples/sec among these configurations at this batch (None if none ran)."""
    rates = [rate for key in keys if (rate := median(summary, key, batch)) is not None]
    return max(rates, default=None)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing (or zero): a ratio of nothing is not measured."""
    return numerator / denominator if numerator and denominator else None


def np2_efficiency(summary: Summary, batch: int, one_rank: float | None) -> dict[str, float | None]:
    """Each np=2 launch's throughput / (2 x `one_rank`'s): the efficiencies differ only in what one rank is."""
    return {key: ratio(median(summary, key, batch), 2 * one_rank) if one_rank else None for key in HVD_NP2}


def derive(summary: Summary, configs: list[Config], batches: list[int]) -> dict[int, dict]:
    """Scaling efficiency and ratios to the floor and best peer, per batch."""
    training = [c.key for c in configs if c.per_batch and c.group != "pipeline"]
    derived = {}
    for batch in batches:
        peer_key, peer_rate = best_peer(summary, configs, batch)
        floor = median(summary, "floor", batch)
        floor_step = median(summary, "floor", batch, "sec_per_batch")
        np1 = median(summary, "hvd_np1", batch)
        one_core = median(summary, "floor_1core", batch)
        trainer_one_core = median(summary, "hvd_np1_1core", batch)
        training_per_rank = ratio(max_rate(summary, HVD_NP2, batch), 2)
        derived[batch] = {
            "best_peer": peer_key,
            "scaling_efficiency": np2_efficiency(summary, batch, np1),
            "true_efficiency": np2_efficiency(summary, batch, one_core),
            # The true efficiency's two factors: the trainer's own work beside the floor's (moving average, L2,
            # input pipeline), and the collectives against that same work on one core.
            "trainer_work_vs_floor_1core": ratio(trainer_one_core, one_core),
            "collective_efficiency": np2_efficiency(summary, batch, trainer_one_core),
            "throughput_vs_floor": {key: ratio(median(summary, key, batch), floor) for key in training},
            "throughput_vs_best_peer": {key: ratio(median(summary, key, batch), peer_rate) for key in training},
            "step_time_vs_floor": {key: ratio(median(summary, key, batch, "sec_per_batch"), floor_step)
                                   for key in training},
            "pipeline_vs_training_per_rank": ratio(median(summary, "pipeline", batch), training_per_rank),
            # The flight recorder's cost: np=2 Gloo's step time with it on against off (1.0: free).
            "flight_recorder_step_time": ratio(median(summary, "hvd_np2_gloo", batch, "sec_per_batch"),
                                               median(summary, "hvd_np2_gloo_unrecorded", batch, "sec_per_batch")),
        }
    return derived


def targets(summary: Summary, derived: dict[int, dict], configs: list[Config], batches: list[int]) -> dict:
    """The project's throughput targets, each with the figures it was decided on (None: not measured); the
    time-to-accuracy target is race.race_target's."""
    result = {}
    for batch in batches:
        _, peer_rate = best_peer(summary, configs, batch)
        for key in HVD_NP2:
            rate = median(summary, key, batch)
            result[f"{key}_beats_every_peer_b{batch}"] = {
                "met": None if rate is None or peer_rate is None else rate >= peer_rate,
                "hvd_mnist": rate, "best_peer": peer_rate}
            efficiency = derived[batch]["true_efficiency"][key]
            goal = 0.90 if batch >= 1000 else 0.80
            result[f"{key}_true_efficiency_{goal:.2f}_b{batch}"] = {
                "met": None if efficiency is None else efficiency >= goal, "efficiency": efficiency}
        recorder = derived[batch]["flight_recorder_step_time"]
        result[f"flight_recorder_within_3pct_b{batch}"] = {"met": None if recorder is None else recorder <= 1.03,
                                                          "ratio": recorder}
        pipeline = derived[batch]["pipeline_vs_training_per_rank"]
        result[f"pipeline_10x_training_b{batch}"] = {"met": None if pipeline is None else pipeline >= 10,
                                                    "ratio": pipeline}
    if 1000 in batches:
        step_ratio = derived[1000]["step_time_vs_floor"].get("hvd_np1")
        result["hvd_np1_within_1.15x_floor_step_time_b1000"] = {
            "met": None if step_ratio is None else step_ratio <= 1.15, "ratio": step_ratio}
    return result
