"""The benchmark's shaped-link mode: N = 2, 3, 4 ranks on as many hosts (netns.py), each link held to a rate by
tbf; the MLP gradient's allreduce alone (Gloo; MPI with Open MPI's default and its ring algorithm; fp16) and full
training steps, measured, then checked against the ring model of scaling.py with alpha and B fitted per link rate.

The ranks share this machine's cores: N = 3 and 4 are oversubscribed. The allreduce-only runs wait on the link
and are communication-bound; a training step's compute is measured in place, on the same N hosts with their
links unshaped, so that the prediction for a shaped link is that step plus the model's allreduce.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hvd_mnist.launching import launch_argv, launcher_env

from .launching import PEERS, ROOT, BenchmarkError
from .netns import INTERFACE, NetnsCluster
from .scaling import fit_alpha_bandwidth, gradient_bytes, ring_allreduce_seconds

RATES_MBIT = (1000, 200, 20)
WORKERS = (2, 3, 4)
MPI_RING = ["-mca", "coll_tuned_use_dynamic_rules", "1", "-mca", "coll_tuned_allreduce_algorithm", "4"]
COMM_SECONDS = 6.0  # about how long each measurement waits on its link
SUBNET = "10.210.0"


@dataclass(frozen=True)
class Point:
    """One measurement: seconds per allreduce call or per training step."""

    kind: str  # allreduce | step
    launcher: str  # gloo | mpi | mpi-ring
    n: int
    link_mbit: float | None  # None: unshaped
    fp16: bool
    seconds: float


def shaped_hosts(n: int, workdir: Path, rate_mbit: float | None) -> NetnsCluster:
    """Hosts h0, h1, ... on SUBNET, each sending at `rate_mbit` (None: unshaped); not yet started."""
    return NetnsCluster(workdir, [f"h{i}" for i in range(n)], SUBNET, rate_mbit)


def nominal(n: int, link_mbit: float, fp16: bool = False) -> float:
    """The model's allreduce seconds at the link's nominal rate, no latency: what sizes each run."""
    return ring_allreduce_seconds(n, gradient_bytes("mlp", fp16), link_mbit * 1e6 / 8, 0.0)


def launch(hosts: NetnsCluster, launcher: str, argv: list[str], timeout: int) -> None:
    """Run `python ARGV` on one rank per host with horovodrun --gloo or mpirun, over the hosts' interface."""
    n = len(hosts.hosts)
    options = (["--network-interface", INTERFACE] if launcher == "gloo" else
               ["-mca", "btl_tcp_if_include", INTERFACE, "-mca", "oob_tcp_if_include", INTERFACE,
                *(MPI_RING if launcher == "mpi-ring" else [])])
    command = launch_argv("gloo" if launcher == "gloo" else "mpirun", n, sys.executable, *argv,
                          hosts=hosts.host_spec(), options=options)
    proc = subprocess.run(hosts.exec_argv(command), env=hosts.env(launcher_env()), cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
        raise BenchmarkError(f"{launcher} on {n} hosts exited {proc.returncode}: {tail[0] if tail else ''}")


def allreduce(hosts: NetnsCluster, launcher: str, link_mbit: float | None, fp16: bool, work: Path,
              timeout: int) -> float:
    """Seconds per call of the gradient's allreduce, timed after a fifth of the calls."""
    expected = nominal(len(hosts.hosts), link_mbit or 10_000, fp16)
    calls = max(10, min(60, int(COMM_SECONDS / expected)))
    out = work / f"allreduce-{launcher}-{len(hosts.hosts)}-{link_mbit}-{fp16}.json"
    launch(hosts, launcher, [str(PEERS / "allreduce.py"), "--calls", str(calls), "--warmup-calls",
                             str(max(2, calls // 5)), "--out", str(out), *(["--fp16"] if fp16 else [])], timeout)
    return json.loads(out.read_text())["sec_per_call"]


def training_step(hosts: NetnsCluster, link_mbit: float | None, work: Path, timeout: int) -> float:
    """Median seconds per step of hvd_mnist (MLP, batch 100 per rank) after its first logged interval."""
    expected = nominal(len(hosts.hosts), link_mbit or 10_000) + 0.02
    steps = max(40, min(300, int(COMM_SECONDS * 1.5 / expected)))
    run_dir = work / f"train-{len(hosts.hosts)}-{link_mbit}"
    launch(hosts, "gloo", ["-m", "hvd_mnist", "--steps", str(steps), "--log-every", str(steps // 5),
                           "--checkpoint-every", str(steps), "--output-dir", str(run_dir)], timeout)
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.median([e["sec_per_batch"] for e in events if e["event"] == "train"][1:])


def measure(timeout: int, rates: tuple[float, ...] = RATES_MBIT, workers: tuple[int, ...] = WORKERS) -> list[Point]:
    """Every point of the mode, hosts rebuilt for each N and rate (the namespaces take under a second)."""
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="hvd-mnist-links-") as folder:
        work = Path(folder)
        for n in workers:
            for rate in (None, *rates):
                hosts = shaped_hosts(n, work / f"hosts-{n}-{rate}", rate)
                try:
                    hosts.start()
                    runs = [("allreduce", "gloo", False)] if rate else []
                    if rate == 200:
                        runs += [("allreduce", "mpi", False), ("allreduce", "mpi-ring", False)]
                    if rate in (200, 20):
                        runs += [("allreduce", "gloo", True)]
                    if rate in (None, 200, 20):
                        runs += [("step", "gloo", False)]
                    for kind, launcher, fp16 in runs:
                        seconds = (allreduce(hosts, launcher, rate, fp16, work, timeout) if kind == "allreduce"
                                   else training_step(hosts, rate, work, timeout))
                        points.append(Point(kind, launcher, n, rate, fp16, seconds))
                        print(f"  {kind:9} {launcher:8} N={n} {rate or 'unshaped'!s:>8} Mbit/s"
                              f"{' fp16' if fp16 else ''}: {seconds * 1000:.1f} ms", flush=True)
                finally:
                    hosts.close()
    return points


def analyse(points: list[Point]) -> dict:
    """alpha and B fitted per rate from Gloo's float32 allreduces; every point's prediction and relative error."""
    fits = {}
    for rate in sorted({p.link_mbit for p in points if p.link_mbit}):
        samples = [(p.n, gradient_bytes("mlp"), p.seconds) for p in points
                   if p.kind == "allreduce" and p.launcher == "gloo" and not p.fp16 and p.link_mbit == rate]
        if len({n for n, _, _ in samples}) >= 2:
            alpha, bandwidth = fit_alpha_bandwidth(samples)
            fits[rate] = {"alpha_s": alpha, "bandwidth_bytes_per_s": bandwidth,
                          "bandwidth_of_nominal": bandwidth / (rate * 1e6 / 8)}
    unshaped = {p.n: p.seconds for p in points if p.kind == "step" and p.link_mbit is None}
    rows = []
    for p in points:
        fit = fits.get(p.link_mbit)
        if fit is None or (p.kind == "step" and p.n not in unshaped):
            continue
        comm = ring_allreduce_seconds(p.n, gradient_bytes("mlp", p.fp16), fit["bandwidth_bytes_per_s"],
                                      fit["alpha_s"])
        predicted = comm + (unshaped[p.n] if p.kind == "step" else 0.0)
        rows.append({**asdict(p), "predicted": predicted, "error": predicted / p.seconds - 1})
    return {"fits": {str(rate): fit for rate, fit in fits.items()}, "rows": rows,
            "unshaped_step_seconds": {str(n): s for n, s in unshaped.items()}}


def table(analysis: dict) -> str:
    """Measured against predicted, one line a point, and the fits."""
    lines = ["shaped links: measured vs the ring model (alpha, B fitted per rate from Gloo's float32 allreduces)",
             f"{'what':9} {'launcher':8} {'N':>2} {'Mbit/s':>7} {'fp16':>4} {'measured ms':>12} {'model ms':>9} "
             f"{'error':>7}"]
    for row in analysis["rows"]:
        fp16 = "yes" if row["fp16"] else ""
        lines.append(f"{row['kind']:9} {row['launcher']:8} {row['n']:>2} {row['link_mbit']:>7g} {fp16:>4} "
                     f"{row['seconds'] * 1000:>12.1f} {row['predicted'] * 1000:>9.1f} {row['error']:>+7.0%}")
    for rate, fit in analysis["fits"].items():
        lines.append(f"fit at {rate} Mbit/s: alpha = {fit['alpha_s'] * 1e6:.0f} us, B = "
                     f"{fit['bandwidth_bytes_per_s'] * 8 / 1e6:.1f} Mbit/s "
                     f"({fit['bandwidth_of_nominal']:.0%} of nominal)")
    return "\n".join(lines)


def run(out: Path, timeout: int, rates: tuple[float, ...] = RATES_MBIT, workers: tuple[int, ...] = WORKERS) -> int:
    """The whole mode: measure, analyse, print, write OUT/shaped_links.json; 0, or 1 if a run failed."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    try:
        points = measure(timeout, rates, workers)
    except BenchmarkError as err:
        print(f"benchmark: error: shaped links: {err}", file=sys.stderr)
        return 1
    analysis = analyse(points)
    print(table(analysis), flush=True)
    results = {"points": [asdict(p) for p in points], **analysis, "gradient_bytes": gradient_bytes("mlp"),
               "seconds": round(time.perf_counter() - started)}
    (out / "shaped_links.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "scaling_inputs.json").write_text(json.dumps(plan_inputs(points, analysis), indent=2) + "\n")
    print(f"wrote {out / 'shaped_links.json'} and {out / 'scaling_inputs.json'} (for scripts/scaling_plan.py "
          "--inputs, which puts them in docs/scaling.md)")
    return 0


def plan_inputs(points: list[Point], analysis: dict) -> dict:
    """The measured points and fits in scripts/scaling_plan.py's --inputs form; a step's compute is the same
    N hosts' unshaped step."""
    unshaped = analysis["unshaped_step_seconds"]
    measured = [{"n": p.n, "link_mbit": p.link_mbit, "kind": p.kind, "model": "mlp", "fp16": p.fp16,
                 "seconds": p.seconds, "launcher": p.launcher, "batch": 100,
                 **({"compute_ms": unshaped[str(p.n)] * 1000} if p.kind == "step" else {})}
                for p in points if p.link_mbit is not None and (p.kind != "step" or str(p.n) in unshaped)]
    # Keyed as scaling_plan.py keys a link ("RATE/LAUNCHER"): the plan uses these fits of Gloo's float32
    # allreduces, the ones this mode printed, instead of fitting the same runs again; other launchers it fits.
    fits = {f"{float(rate):g}/gloo": {"alpha_s": fit["alpha_s"], "bandwidth_bytes_per_s": fit["bandwidth_bytes_per_s"]}
            for rate, fit in analysis["fits"].items()}
    return {"measured": measured, "fits": fits}
