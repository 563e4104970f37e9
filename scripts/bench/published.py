"""The benchmark's figures in the docs, written from one committed results.json so that they cannot drift.

    .venv/bin/python scripts/benchmark.py --publish bench_out/results.json   # copy it to docs/, rewrite all
    .venv/bin/python scripts/benchmark.py --publish                          # rewrite from docs/results.json

README.md and docs/benchmark.md each hold one section between `<!-- results:begin -->` and
`<!-- results:end -->` that only this module writes; docs/benchmark_chart.png is drawn from the same file and
carries its SHA-256, so that tests/test_docs.py can tell a section or a chart that no longer matches it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import shutil
from pathlib import Path

from .configs import Config
from .launching import ROOT
from .phases import LABELS, PHASES
from .report import chart, fmt

RESULTS = ROOT / "docs" / "results.json"
CHART = ROOT / "docs" / "benchmark_chart.png"
SECTIONS = {ROOT / "README.md": "readme", ROOT / "docs" / "benchmark.md": "benchmark"}
BEGIN, END = "<!-- results:begin (scripts/bench/published.py writes this from docs/results.json) -->", \
    "<!-- results:end -->"
SECTION = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.DOTALL)
CHART_KEY = "results.json sha256"
# The README table's configurations, by the names its header gives them; the targets' words use the same names.
COLUMNS = {"floor_1core": "compute floor, 1 core", "hvd_np1_1core": "hvd_mnist np=1, 1 core",
           "hvd_np2_gloo": "np=2 Gloo", "hvd_np2_mpirun": "np=2 mpirun"}
OUTCOMES = {False: "missed", True: "met", None: "not measured"}  # a target's "met", in the order they are listed


def run_date(results: dict) -> str:
    """The day the run started (UTC), from its first launch."""
    first = min(run["launched_at"] for run in results["runs"])
    return datetime.datetime.fromtimestamp(first, datetime.UTC).date().isoformat()


def rate(results: dict, key: str, batch: int) -> float | None:
    stats = results["summary"].get(key, {}).get(str(batch))
    return stats["examples_per_sec"]["median"] if stats else None


def readme_section(results: dict) -> str:
    """The README's results: examples/sec per batch, the race in one line, and the targets met and missed."""
    derived = results["derived"]
    settings = results["settings"]
    lines = [f"The full benchmark of {run_date(results)} (`python scripts/benchmark.py --time-to-accuracy`, "
             f"{settings['repeats']} repeats x {settings['steps']} steps, {results['machine']['cores']} cores), "
             "medians of global examples/sec; all figures: [docs/benchmark.md](docs/benchmark.md).", "",
             "| per-worker batch | " + " | ".join(COLUMNS.values()) +
             " | best peer | np=2 against the best peer, Gloo / mpirun |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for batch in settings["batch_sizes"]:
        d = derived[str(batch)]
        cells = [fmt(rate(results, key, batch), ",.0f") for key in COLUMNS]
        versus = " / ".join(fmt(d["throughput_vs_best_peer"].get(key), ".2f") + "x"
                            for key in ("hvd_np2_gloo", "hvd_np2_mpirun"))
        peer = results["configs"].get(d["best_peer"], {}).get("label", "-").removeprefix("peer: ")
        lines.append(f"| {batch} | {' | '.join(cells)} | {peer} | {versus} |")
    race = results.get("time_to_accuracy")
    if race:
        lines += ["", race_sentence(race)]
    return "\n".join([*lines, "", *targets_summary(results)])


def targets_summary(results: dict) -> list[str]:
    """The targets in a few lines: how many were met, then the missed, the met and the unmeasured ones, each with
    the figure it was decided on and its goal."""
    groups = {outcome: [target_line(name, target, results) for name, target in results["targets"].items()
                        if target["met"] is met] for met, outcome in OUTCOMES.items()}
    lines = [f"**Targets**: {len(groups['met'])} of {len(results['targets'])} met (each by name: "
             "[docs/benchmark.md](docs/benchmark.md#the-current-run)).", ""]
    return lines + [f"- {outcome.capitalize()}: " + "; ".join(words) + "." for outcome, words in groups.items()
                    if words]


def target_line(name: str, target: dict, results: dict) -> str:
    """A target in a line, "np=2 Gloo's true parallel efficiency at batch 100: 0.55 (target 0.80)", without the
    figure where it was not measured."""
    what, figure, goal = target_words(name, target, results)
    return f"{what}: {figure} (target {goal})" if target["met"] is not None else f"{what} (target {goal})"


def target_words(name: str, target: dict, results: dict) -> tuple[str, str, str]:
    """A target as a reader says it: what it holds, the figure it was decided on and its goal, which stats.py and
    race.py write into its name ("np=2 Gloo's true parallel efficiency at batch 100", "0.55", "0.80")."""
    batch = re.search(r"_b(\d+)$", name)
    at = f" at batch {batch[1]}" if batch else ""
    if found := re.fullmatch(r"(hvd_np2_\w+)_beats_every_peer_b\d+", name):
        return (f"{COLUMNS[found[1]]}{at}", f"{fmt(target['hvd_mnist'], ',.0f')} examples/s",
                f"the best peer's {fmt(target['best_peer'], ',.0f')}")
    if found := re.fullmatch(r"(hvd_np2_\w+)_true_efficiency_([\d.]+)_b\d+", name):
        return f"{COLUMNS[found[1]]}'s true parallel efficiency{at}", fmt(target["efficiency"], ".2f"), found[2]
    if found := re.fullmatch(r"flight_recorder_within_(\d+)pct_b\d+", name):
        cost = None if target["ratio"] is None else (target["ratio"] - 1) * 100
        return f"the flight recorder's cost in step time{at}", f"{fmt(cost, '+.1f')}%", f"at most {found[1]}%"
    if found := re.fullmatch(r"pipeline_(\d+)x_training_b\d+", name):
        return f"the input pipeline{at}", f"{fmt(target['ratio'], '.0f')}x a rank's training", f"{found[1]}x"
    if found := re.fullmatch(r"hvd_np1_within_([\d.]+)x_floor_step_time_b\d+", name):
        return f"np=1's step time{at}", f"{fmt(target['ratio'], '.2f')}x the compute floor's", f"at most {found[1]}x"
    if found := re.fullmatch(r"time_to_accuracy_within_([\d.]+)x_(\w+)", name):
        rival = results["configs"][found[2]]["label"].removeprefix("peer: ")
        return (f"time to accuracy against {rival}", f"{fmt(target['ratio'], '.2f')}x its wall time, "
                f"{fmt(target['hvd_mnist_wall_s'], '.1f')} s against {fmt(target['rival_wall_s'], '.1f')} s",
                f"at most {found[1]}x")
    raise ValueError(f"bench/published.py's target_words has no words for the target {name}: add them")


def race_sentence(race: dict) -> str:
    """Who reached the target accuracy in how long, launch to exit."""
    parts = []
    for role, record in race["contenders"].items():
        reached = "steps_to_target" in record.get("figures", {})
        wall = f"{record['wall_s']:.1f} s" if reached else "did not reach it"
        parts.append(f"{'hvd_mnist' if role == 'hvd_mnist' else role.removeprefix('peer_')} {wall}")
    return (f"Time to {race['target_validation_accuracy']:.0%} validation accuracy on Fashion-MNIST, np=2, batch "
            f"{race['batch_size']}, launch to exit: " + ", ".join(parts) + ".")


def benchmark_section(results: dict) -> str:
    """docs/benchmark.md's current run: the chart, every configuration per batch, the targets and the race."""
    configs = results["configs"]
    settings, machine, versions = results["settings"], results["machine"], results["machine"]["versions"]
    lines = [f"Run of {run_date(results)}: {settings['repeats']} repeats x {settings['steps']} steps "
             f"({settings['warmup_steps']} untimed), {machine['cores']} cores, Python {machine['python']}, "
             f"TensorFlow {versions.get('tensorflow-cpu')}, PyTorch {versions.get('torch')}; "
             f"{results['duration_s'] / 60:.0f} minutes.", "", "![chart](benchmark_chart.png)"]
    for batch in results["settings"]["batch_sizes"]:
        d = results["derived"][str(batch)]
        lines += ["", f"**Per-worker batch {batch}** (medians; best peer: {d['best_peer']})", "",
                  "| configuration | examples/s | spread | ms/step | x floor | x best peer |",
                  "|---|---:|---:|---:|---:|---:|"]
        for key, config in configs.items():
            stats = results["summary"].get(key, {}).get(str(batch))
            if not stats or config["group"] == "pipeline":
                continue
            spread = f"{stats['examples_per_sec']['min']:,.0f}..{stats['examples_per_sec']['max']:,.0f}"
            lines.append(f"| {config['label']} | {stats['examples_per_sec']['median']:,.0f} | {spread} | "
                         f"{stats['sec_per_batch']['median'] * 1000:.2f} | "
                         f"{fmt(d['throughput_vs_floor'].get(key), '.2f')} | "
                         f"{fmt(d['throughput_vs_best_peer'].get(key), '.2f')} |")
        true, collective = d["true_efficiency"], d["collective_efficiency"]
        lines += ["", f"True parallel efficiency (np=2 over twice the one-core floor), Gloo / mpirun: "
                      f"{fmt(true['hvd_np2_gloo'], '.2f')} / {fmt(true['hvd_np2_mpirun'], '.2f')} = the trainer's "
                      f"work beside the floor's, {fmt(d['trainer_work_vs_floor_1core'], '.2f')}, x the collective "
                      f"efficiency, {fmt(collective['hvd_np2_gloo'], '.2f')} / "
                      f"{fmt(collective['hvd_np2_mpirun'], '.2f')}. The input pipeline alone runs "
                      f"{fmt(d['pipeline_vs_training_per_rank'], '.0f')}x a rank's training."]
    reducers = [(config["label"], results["summary"][key]["any"]) for key, config in configs.items()
                if config["group"] == "allreduce" and "any" in results["summary"].get(key, {})]
    if reducers:
        lines += ["", "The gradient's allreduce alone: " + "; ".join(
            f"{label}: {stats['sec_per_call']['median'] * 1000:.2f} ms/call" for label, stats in reducers) + "."]
    race = results.get("time_to_accuracy")
    if race:
        lines += ["", f"**Time to accuracy.** {race_sentence(race)} Each racer in phases, seconds "
                      "([what each phase holds](#the-time-to-accuracy-race)):", "", phase_table(race)]
    lines += ["", "**Targets** (scripts/bench/stats.py and race.py):", ""]
    for name, target in results["targets"].items():
        _, figure, goal = target_words(name, target, results)
        outcome = OUTCOMES[target["met"]].replace("missed", "**missed**")
        measured = f", {figure}" if target["met"] is not None else ""
        lines.append(f"- `{name}`: {outcome}{measured} (target {goal})")
    return "\n".join(lines)


def phase_table(race: dict) -> str:
    """The race's phases as a markdown table, one column per racer."""
    racers = {role: record["phases"] for role, record in race["contenders"].items() if "phases" in record}
    lines = ["| phase | " + " | ".join(racers) + " |", "|---|" + "---:|" * len(racers)]
    for phase in (*PHASES, "total"):
        cells = []
        for spans in racers.values():
            value = sum(v for v in spans.values() if v is not None) if phase == "total" else spans[phase]
            cells.append("-" if value is None else f"{value:.2f}")
        label = "**launch to exit**" if phase == "total" else LABELS[phase]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sections(results: dict) -> dict[str, str]:
    return {"readme": readme_section(results), "benchmark": benchmark_section(results)}


def rewritten(text: str, body: str, path: Path) -> str:
    """`text` with its results section holding `body`."""
    if not SECTION.search(text):
        raise ValueError(f"{path} has no {BEGIN} ... {END} section")
    return SECTION.sub(lambda _: f"{BEGIN}\n{body}\n{END}", text)


def stale(results_path: Path = RESULTS) -> list[str]:
    """What no longer matches results.json: the docs whose section differs, and the chart if it was drawn from
    other figures."""
    results = json.loads(results_path.read_text())
    bodies = sections(results)
    out = [str(path.relative_to(ROOT)) for path, name in SECTIONS.items()
           if rewritten(path.read_text(), bodies[name], path) != path.read_text()]
    if chart_digest(CHART) != digest(results_path):
        out.append(str(CHART.relative_to(ROOT)))
    return out


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def chart_digest(path: Path) -> str | None:
    """The results.json SHA-256 that publish() wrote into the chart's PNG text chunk (None: none)."""
    if not path.exists():
        return None
    found = re.search(re.escape(CHART_KEY).encode() + rb"\x00([0-9a-f]{64})", path.read_bytes())
    return found.group(1).decode() if found else None


def publish(source: Path | None) -> list[Path]:
    """Copy `source` to docs/results.json (unless None), draw the chart from it, rewrite both sections."""
    if source is not None and source.resolve() != RESULTS.resolve():
        shutil.copyfile(source, RESULTS)
    results = json.loads(RESULTS.read_text())
    configs = [Config(key, c["label"], c["group"], c["launcher"], c["np"], lambda *_: [], lambda _: {},
                      per_batch=c["group"] != "allreduce") for key, c in results["configs"].items()]
    summary = {key: {None if batch == "any" else int(batch): stats for batch, stats in batches.items()}
               for key, batches in results["summary"].items()}
    chart(summary, configs, results["settings"]["batch_sizes"], CHART, metadata={CHART_KEY: digest(RESULTS)})
    bodies = sections(results)
    for path, name in SECTIONS.items():
        path.write_text(rewritten(path.read_text(), bodies[name], path))
    return [RESULTS, CHART, *SECTIONS]
