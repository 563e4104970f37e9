"""What the benchmark shows and keeps: the stdout table, the chart, the machine it ran on, and results.json."""

from __future__ import annotations

import json
import platform
from importlib import metadata
from pathlib import Path

from .configs import CORES, Config
from .stats import Summary

LIBRARIES = ("tensorflow-cpu", "horovod", "torch", "numpy", "mpi4py", "matplotlib")


def fmt(value: float | None, spec: str) -> str:
    """A figure formatted, or "-" where it was not measured."""
    return "-" if value is None else format(value, spec)


def table(summary: Summary, derived: dict[int, dict], configs: list[Config], batches: list[int]) -> str:
    """The stdout table: per batch, every configuration's median examples/sec, spread, step time and ratios."""
    lines = []
    header = (f"{'configuration':<42}{'examples/s':>12}{'spread (min..max)':>22}{'ms/step':>9}"
              f"{'x floor':>9}{'x best peer':>13}")
    for batch in batches:
        d = derived[batch]
        lines += ["", f"per-worker batch {batch} (medians; best peer: {d['best_peer']})", header]
        for c in configs:
            stats = summary.get(c.key, {}).get(batch, {})
            if not c.per_batch or not stats:
                continue
            rate = stats["examples_per_sec"]
            vs_floor = "-" if c.group == "pipeline" else fmt(d["throughput_vs_floor"][c.key], ".2f")
            vs_peer = (f"{fmt(d['pipeline_vs_training_per_rank'], '.1f')}x trn" if c.group == "pipeline"
                       else fmt(d["throughput_vs_best_peer"][c.key], ".2f"))
            spread = f"{rate['min']:,.0f}..{rate['max']:,.0f}"
            lines.append(f"{c.label:<42}{rate['median']:>12,.0f}{spread:>22}"
                         f"{stats['sec_per_batch']['median'] * 1000:>9.2f}{vs_floor:>9}{vs_peer:>13}")
        efficiency, true = d["scaling_efficiency"], d["true_efficiency"]
        lines.append(f"scaling efficiency np=2/(2 x np=1): gloo {fmt(efficiency['hvd_np2_gloo'], '.2f')}, "
                     f"mpirun {fmt(efficiency['hvd_np2_mpirun'], '.2f')}")
        lines.append(f"true parallel efficiency np=2/(2 x floor on 1 core): gloo {fmt(true['hvd_np2_gloo'], '.2f')}, "
                     f"mpirun {fmt(true['hvd_np2_mpirun'], '.2f')}")
        collective = d["collective_efficiency"]
        lines.append(f"  = np=1 on 1 core / floor on 1 core {fmt(d['trainer_work_vs_floor_1core'], '.2f')}"
                     f" x collective efficiency np=2/(2 x np=1 on 1 core): gloo "
                     f"{fmt(collective['hvd_np2_gloo'], '.2f')}, mpirun {fmt(collective['hvd_np2_mpirun'], '.2f')}")
    for c in configs:
        stats = summary.get(c.key, {}).get(None)  # measured once, not per batch: the allreduce
        if stats:
            call = {name: value * 1000 for name, value in stats["sec_per_call"].items() if name != "n"}
            bandwidth = stats["algbw_gbytes_per_sec"]["median"]
            lines.append(f"{c.label:<42}{call['median']:>8.2f} ms/call  {bandwidth:.2f} GB/s"
                         f"  (spread {call['min']:.2f}..{call['max']:.2f} ms)")
    return "\n".join(lines)


def chart(summary: Summary, configs: list[Config], batches: list[int], path: Path,
          metadata: dict[str, str] | None = None) -> None:
    """Bar chart: examples/sec per training configuration per batch (min..max whiskers), allreduce ms/call;
    `metadata` goes into the PNG's text chunks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    training = [c for c in configs if c.per_batch and c.group != "pipeline"]
    reducers = [c for c in configs if not c.per_batch and c.key in summary]
    panels = len(batches) + (1 if reducers else 0)
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.8), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=False):
        shown = [c for c in training if batch in summary.get(c.key, {})]
        _bars(ax, [c.label for c in shown], [summary[c.key][batch]["examples_per_sec"] for c in shown],
              [f"C{['floor', 'hvd_mnist', 'peer'].index(c.group)}" for c in shown])
        ax.set_title(f"per-worker batch {batch}: examples/sec (global)")
    if reducers:
        _bars(axes[0][-1], [c.label for c in reducers], [summary[c.key][None]["sec_per_call"] for c in reducers],
              ["C3"] * len(reducers))
        axes[0][-1].set_title("allreduce of the gradient: seconds/call")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata=metadata)
    plt.close(fig)


def _bars(ax, labels: list[str], stats: list[dict[str, float]], colors: list[str]) -> None:
    medians = [s["median"] for s in stats]
    whiskers = [[m - s["min"] for m, s in zip(medians, stats, strict=True)],
                [s["max"] - m for m, s in zip(medians, stats, strict=True)]]
    ax.barh(range(len(labels)), medians, xerr=whiskers, color=colors, capsize=3)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()


def machine() -> dict:
    """Cores, Python and library versions: what a figure in results.json is to be read against."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"cores": CORES, "python": platform.python_version(), "platform": platform.platform(),
            "versions": versions}


def batch_key(batch: int | None) -> str:
    """results.json's key for a batch (JSON object keys are strings); "any" for what runs once, not per batch."""
    return "any" if batch is None else str(batch)


def write_results(path: Path, results: dict) -> None:
    """results.json: `results` as it is, but for the batch keys of "summary" and "derived", made strings here."""
    summary = {config: {batch_key(batch): stats for batch, stats in batches.items()}
               for config, batches in results["summary"].items()}
    derived = {batch_key(batch): figures for batch, figures in results["derived"].items()}
    document = results | {"summary": summary, "derived": derived}
    path.write_text(json.dumps(document, indent=2, default=float) + "\n")
