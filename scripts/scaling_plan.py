"""The plan for N nodes: predicted step time and parallel efficiency for N = 2..512 workers on real links.

    .venv/bin/python scripts/scaling_plan.py                      # the generated tables to stdout, built-in inputs
    .venv/bin/python scripts/scaling_plan.py --update docs/scaling.md --chart docs/scaling_chart.png
    .venv/bin/python scripts/scaling_plan.py --inputs in.json --update docs/scaling.md --chart docs/scaling_chart.png
    .venv/bin/python scripts/scaling_plan.py --print-defaults > inputs.json   # a template for --inputs

The model is scripts/bench/scaling.py: a ring allreduce of the gradient, t = 2(N-1)/N * S/B + 2(N-1) * alpha, after
the compute of each step (no overlap), efficiency = compute / step time at a fixed per-worker batch (weak scaling).
The inputs are the compute time per step per model and batch (default: this repo's CPU compute floor for the MLP,
docs/benchmark.md; a placeholder for LeNet-5 derived from the FLOPs ratio), the links' rates (25, 100, 400 Gbit/s)
and alpha (5 us, an assumption for datacenter TCP/RDMA), and optionally the shaped-link measurements of issue 24
(measured allreduce and step times, per link rate), from which alpha and B are fitted and the predictions checked.

--inputs FILE is a JSON object; every key is optional and replaces the default (see --print-defaults):
  alpha_s, links_gbit, workers, batches, overlap            the plan's grid and link latency
  compute_ms      {"mlp": {"100": 2.05, "1000": 10.78}, "lenet5": {...}}   ms per step per worker
  gpu_compute_ms  the same for GPUs: adds GPU tables and curves (no GPU has run here yet, so none by default)
  hierarchical    {"ranks_per_node": 8, "intra_gbyte_per_s": 50, "intra_alpha_s": 2e-6}
  fits            {"200": {"alpha_s": 3e-5, "bandwidth_bytes_per_s": 2.4e7}}  per link Mbit/s[/launcher]; else fitted
  measured        [{"n": 3, "link_mbit": 200, "kind": "allreduce" | "step", "model": "mlp", "fp16": false,
                    "seconds": 0.13, "launcher": "gloo", "batch": 100, "compute_ms": 2.5}, ...]
                  (batch and compute_ms for steps; compute_ms defaults to compute_ms[model][batch])

--update DOC rewrites only the parts of DOC between this script's markers (the plan, and the measured section);
--out FILE writes those parts, markers included, to FILE; without either they go to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from bench.scaling import (
    compute_for_efficiency,
    fit_alpha_bandwidth,
    gbit_to_bytes_per_s,
    gradient_bytes,
    hierarchical_allreduce_seconds,
    ring_allreduce_seconds,
)

from hvd_mnist.model_registry import MODELS  # the built-in models, one registry for the package and this plan

TARGET = 0.9
# docs/history.md, "2026-12-03: Gloo's event loop (TensorFlow 2.21)", full run 1: the compute floor
# (scripts/peers/floor.py, the MLP's forward + backward + SGD in one tf.function, one process, TensorFlow's default
# threads: 2 on the 2-core VM). 48,897 examples/s at batch 100 and 92,766 at batch 1000.
MLP_CPU_MS = {100: 2.05, 1000: 10.78}
MLP_CPU_SOURCE = ("measured: docs/history.md, compute floor, TF 2.21, 2026-12-03 'Gloo's event loop', run 1 "
                  "(one process, 2 threads on a 2-core VM)")
LENET5_RATIO = MODELS["lenet5"].forward_macs / MODELS["mlp"].forward_macs  # backward ~ 2x forward in both
LENET5_SOURCE = (f"PLACEHOLDER, not measured: the MLP's CPU time x {LENET5_RATIO:.1f}, LeNet-5's / the MLP's "
                 f"forward multiply-adds ({MODELS['lenet5'].forward_macs:,} / {MODELS['mlp'].forward_macs:,})")
MARKERS = {"plan": ("<!-- scaling_plan.py: plan begin -->", "<!-- scaling_plan.py: plan end -->"),
           "measured": ("<!-- scaling_plan.py: measured begin -->", "<!-- scaling_plan.py: measured end -->")}
# The Horovod paper's models, for the comparison with its 88% on 128 GPUs over 25 GbE. Trainable parameters as
# Keras applications counts them; P100 images/s from TensorFlow's published DGX-1 P100 benchmark (tf_cnn_benchmarks,
# synthetic data, May 2017): Inception V3 142 img/s at batch 64, 128 at batch 32. ResNet-101 is not in that table:
# ResNet-152's 91.8 and 82.7 img/s scaled by the FLOPs ratio 11.3 / 7.6 (He et al. 2016).
PAPER_MODELS = (("Inception V3", 23.8e6, {32: 32 / 128, 64: 64 / 142}),
                ("ResNet-101", 44.6e6, {32: 32 / (82.7 * 11.3 / 7.6), 64: 64 / (91.8 * 11.3 / 7.6)}))
PAPER_LINK_GBIT = 25
PAPER_EFFICIENCY = 0.88


def default_inputs() -> dict:
    """The built-in inputs, in --inputs' form (LeNet-5's compute is derived when absent, so it is left out)."""
    return {
        "alpha_s": 5e-6,
        "links_gbit": [25, 100, 400],
        "workers": [2**k for k in range(1, 10)],
        "batches": [100, 1000],
        "overlap": 0.0,
        "compute_ms": {"mlp": {str(b): ms for b, ms in MLP_CPU_MS.items()}},
        "gpu_compute_ms": {},
        "hierarchical": {"ranks_per_node": 8, "intra_gbyte_per_s": 50.0, "intra_alpha_s": 2e-6},
        "fits": {},
        "measured": [],
    }


@dataclass
class Fit:
    """alpha and B of one shaped link (per rate and launcher) and where they came from."""

    alpha_s: float
    bandwidth: float
    how: str


@dataclass
class Plan:
    """The resolved inputs: every number the tables and the chart are computed from."""

    alpha_s: float
    links_gbit: list[float]
    workers: list[int]
    batches: list[int]
    overlap: float
    compute_s: dict[str, dict[int, float]]
    compute_source: dict[str, str]
    gpu_compute_s: dict[str, dict[int, float]]
    ranks_per_node: int
    intra_bandwidth: float
    intra_alpha_s: float
    measured: list[dict]
    fits: dict[str, Fit] = field(default_factory=dict)

    def allreduce(self, n: int, size: float, gbit: float) -> float:
        """The ring allreduce on a link of `gbit` with the plan's alpha."""
        return ring_allreduce_seconds(n, size, gbit_to_bytes_per_s(gbit), self.alpha_s)

    def exposed(self, n: int, size: float, gbit: float) -> float:
        """The allreduce time the step waits for: all of it without overlap."""
        return (1.0 - self.overlap) * self.allreduce(n, size, gbit)

    def hierarchical(self, n: int, size: float, gbit: float, shared_link: bool) -> float:
        """The unhidden part of a hierarchical allreduce with the plan's nodes and intra-node link."""
        return (1.0 - self.overlap) * hierarchical_allreduce_seconds(
            n, size, gbit_to_bytes_per_s(gbit), self.alpha_s, self.ranks_per_node, self.intra_bandwidth,
            self.intra_alpha_s, shared_link)


def _ms_table(raw: dict, what: str) -> dict[str, dict[int, float]]:
    table = {}
    for model, per_batch in raw.items():
        if model not in MODELS:
            raise ValueError(f"{what}: unknown model {model!r} (known: {', '.join(MODELS)})")
        table[model] = {int(batch): float(ms) / 1000 for batch, ms in per_batch.items()}
    return table


def resolve(inputs: dict) -> Plan:
    """Defaults overlaid with the given inputs, validated; LeNet-5's CPU compute derived when not given."""
    merged = default_inputs()
    unknown = [key for key in inputs if key not in merged and not key.startswith("_")]
    if unknown:
        raise ValueError(f"unknown input keys: {', '.join(unknown)} (known: {', '.join(merged)})")
    given_compute = inputs.get("compute_ms", {})
    merged.update({key: value for key, value in inputs.items() if not key.startswith("_")})
    merged["compute_ms"] = {**default_inputs()["compute_ms"], **given_compute}
    compute = _ms_table(merged["compute_ms"], "compute_ms")
    source = {model: ("given in --inputs" if model in given_compute else MLP_CPU_SOURCE) for model in compute}
    if "lenet5" not in compute:
        compute["lenet5"] = {batch: ms * LENET5_RATIO for batch, ms in compute["mlp"].items()}
        source["lenet5"] = LENET5_SOURCE
    batches = [int(b) for b in merged["batches"]]
    for model in MODELS:
        if missing := [b for b in batches if b not in compute[model]]:
            raise ValueError(f"compute_ms has no {model} time for batch {missing}")
    hier = merged["hierarchical"]
    plan = Plan(alpha_s=float(merged["alpha_s"]), links_gbit=[float(g) for g in merged["links_gbit"]],
                workers=sorted(int(n) for n in merged["workers"]), batches=batches, overlap=float(merged["overlap"]),
                compute_s=compute, compute_source=source, gpu_compute_s=_ms_table(merged["gpu_compute_ms"], "gpu"),
                ranks_per_node=int(hier["ranks_per_node"]),
                intra_bandwidth=float(hier["intra_gbyte_per_s"]) * 1e9, intra_alpha_s=float(hier["intra_alpha_s"]),
                measured=[_measurement(m) for m in merged["measured"]])
    if not 0.0 <= plan.overlap <= 1.0:
        raise ValueError(f"overlap is a fraction in [0, 1], got {plan.overlap}")
    if partial_nodes := [n for n in plan.workers if n > plan.ranks_per_node and n % plan.ranks_per_node]:
        raise ValueError(f"workers {partial_nodes} are not whole nodes of {plan.ranks_per_node} ranks (hierarchical)")
    plan.fits = _fits(plan.measured, merged["fits"])
    return plan


def _measurement(raw: dict) -> dict:
    entry = {"fp16": False, "launcher": "", "model": "mlp", **raw}
    for key in ("n", "link_mbit", "kind", "seconds"):
        if key not in entry:
            raise ValueError(f"measured entry {raw} lacks {key!r}")
    if entry["kind"] not in ("allreduce", "step"):
        raise ValueError(f"measured kind is 'allreduce' or 'step', got {entry['kind']!r}")
    if entry["kind"] == "step" and "batch" not in entry:
        raise ValueError(f"measured step {raw} lacks 'batch'")
    entry.setdefault("size_bytes", gradient_bytes(entry["model"], entry["fp16"]))
    return entry


def _link_key(entry: dict) -> str:
    return f"{entry['link_mbit']:g}" + (f"/{entry['launcher']}" if entry["launcher"] else "")


def _fits(measured: list[dict], given: dict) -> dict[str, Fit]:
    """alpha and B per shaped link: given in the inputs, else fitted from its allreduce runs, else the nominal rate."""
    fits = {}
    for key in dict.fromkeys(_link_key(m) for m in measured):
        if key in given:
            fits[key] = Fit(float(given[key]["alpha_s"]), float(given[key]["bandwidth_bytes_per_s"]), "given")
            continue
        samples = [(m["n"], m["size_bytes"], m["seconds"]) for m in measured
                   if _link_key(m) == key and m["kind"] == "allreduce"]
        try:
            alpha, bandwidth = fit_alpha_bandwidth(samples)
            fits[key] = Fit(alpha, bandwidth, f"fitted, {len(samples)} allreduce runs")
        except ValueError as error:
            rate = float(key.split("/")[0]) * 1e6 / 8
            fits[key] = Fit(0.0, rate, f"nominal rate, alpha 0 (no fit: {error})")
    return fits


def compute_at(per_batch: dict[int, float], batch: float) -> float:
    """Compute per step at any batch: a line through the two extreme known batches (fixed cost + per example)."""
    low, high = min(per_batch), max(per_batch)
    if low == high:
        return per_batch[low] * batch / low
    slope = (per_batch[high] - per_batch[low]) / (high - low)
    return per_batch[low] + slope * (batch - low)


def batch_for(per_batch: dict[int, float], compute_s: float) -> float:
    """The per-worker batch whose compute per step is `compute_s`, on the same line as compute_at."""
    low, high = min(per_batch), max(per_batch)
    if low == high:
        return compute_s / per_batch[low] * low
    slope = (per_batch[high] - per_batch[low]) / (high - low)
    return low + (compute_s - per_batch[low]) / slope


def fmt_ms(seconds: float) -> str:
    """Milliseconds to three significant figures, thousands separated."""
    ms = seconds * 1000
    return f"{ms:,.0f}" if ms >= 99.95 else f"{ms:#.3g}".rstrip(".")


def fmt_eff(value: float) -> str:
    """Efficiency to three decimals, bold under the 0.9 target."""
    return f"**{value:.3f}**" if value < TARGET else f"{value:.3f}"


def fmt_rate(gbit: float) -> str:
    """A link rate as people quote it: Gbit/s, or Mbit/s under 1 Gbit/s (the shaped links)."""
    return f"{gbit:g} Gbit/s" if gbit >= 1 else f"{gbit * 1000:g} Mbit/s"


def largest_n(plan: Plan, ok: Callable[[int], bool]) -> str:
    """The largest N of the plan's grid up to which every N keeps efficiency >= 0.9."""
    best = "-"
    for n in plan.workers:
        if not ok(n):
            break
        best = str(n)
    return best


def inputs_section(plan: Plan) -> list[str]:
    """Every input with its value and source, so that a reader can tell measured figures from assumptions."""
    lines = ["### Inputs", "", "| input | value | source |", "|---|---|---|"]
    for model in MODELS:
        times = ", ".join(f"{fmt_ms(s)} ms at batch {b}" for b, s in sorted(plan.compute_s[model].items()))
        lines.append(f"| {MODELS[model].label} compute per step (CPU) | {times} | {plan.compute_source[model]} |")
    for model, per_batch in plan.gpu_compute_s.items():
        times = ", ".join(f"{fmt_ms(s)} ms at batch {b}" for b, s in sorted(per_batch.items()))
        lines.append(f"| {MODELS[model].label} compute per step (GPU) | {times} | given, not measured here |")
    if not plan.gpu_compute_s:
        lines.append("| compute per step (GPU) | - | not measured: no GPU run yet; pass `--gpu-compute-ms` |")
    for model, record in MODELS.items():
        lines.append(f"| {record.label} gradient S | {record.params:,} float32 = {gradient_bytes(model):,} bytes "
                     f"({gradient_bytes(model, True):,} with fp16) | parameter count, hvd_mnist/model_registry.py |")
    lines += [f"| link rates B (per rank) | {', '.join(fmt_rate(g) for g in plan.links_gbit)} | the plan's grid |",
              f"| alpha (per message) | {plan.alpha_s * 1e6:g} us | assumption for datacenter TCP/RDMA links |",
              f"| overlap | {plan.overlap:g} | Horovod with these small models: the fused allreduce starts after "
              "the backward pass |",
              f"| hierarchical allreduce | {plan.ranks_per_node} ranks per node, intra-node "
              f"{plan.intra_bandwidth / 1e9:g} GB/s and {plan.intra_alpha_s * 1e6:g} us | assumption "
              "(NVLink-class or shared memory) |", ""]
    return lines


def allreduce_section(plan: Plan) -> list[str]:
    """Allreduce time per model, N and link, with the compute per step that would reach 0.9 (for GPU users)."""
    lines = ["### Allreduce time per step, and the compute per step that reaches 0.9", "",
             "Independent of the batch. The second number of each pair is the compute per step at which the step "
             "reaches efficiency 0.9 (9 x the allreduce): a GPU, or any other worker, must take at least that long "
             "per step to scale at 0.9.", ""]
    for model in MODELS:
        size = gradient_bytes(model)
        lines += [f"**{MODELS[model].label}** (S = {size / 1e6:.2f} MB)", "",
                  "| N | " + " | ".join(f"{fmt_rate(g)}: allreduce ms | compute for 0.9 ms" for g in plan.links_gbit)
                  + " |", "|---:|" + "---:|---:|" * len(plan.links_gbit)]
        for n in plan.workers:
            cells = []
            for gbit in plan.links_gbit:
                t = plan.exposed(n, size, gbit)
                cells += [fmt_ms(t), fmt_ms(compute_for_efficiency(TARGET, t))]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def step_section(plan: Plan, compute: dict[str, dict[int, float]], device: str) -> list[str]:
    """Step time and efficiency per model and batch: the plan's main table."""
    lines = [f"### Predicted step time and efficiency ({device} compute)", "",
             "Step ms = compute + allreduce; efficiency = compute / step (bold: under 0.9).", ""]
    for model in MODELS:
        for batch, compute_s in sorted(compute.get(model, {}).items()):
            lines += [f"**{MODELS[model].label}, per-worker batch {batch}** (compute {fmt_ms(compute_s)} ms/step)",
                      "", "| N | global batch | " + " | ".join(f"{fmt_rate(g)}: step ms | efficiency"
                                                         for g in plan.links_gbit) + " |",
                      "|---:|---:|" + "---:|---:|" * len(plan.links_gbit)]
            for n in plan.workers:
                cells = []
                for gbit in plan.links_gbit:
                    step = compute_s + plan.exposed(n, gradient_bytes(model), gbit)
                    cells += [fmt_ms(step), fmt_eff(compute_s / step)]
                lines.append(f"| {n} | {n * batch:,} | " + " | ".join(cells) + " |")
            lines.append("")
    return lines


REMEDIES = ("as is", "fp16", "hierarchical", "hierarchical, shared link", "fp16 + hierarchical")


def _remedy(plan: Plan, variant: str, model: str, gbit: float, n: int) -> float:
    """The unhidden allreduce time per step with one of the remedies applied."""
    size = gradient_bytes(model, fp16=variant.startswith("fp16"))
    if "hierarchical" in variant:
        return plan.hierarchical(n, size, gbit, shared_link=variant.endswith("shared link"))
    return plan.exposed(n, size, gbit)


def _eff_cell(plan: Plan, compute_s: float, comm: Callable[[int], float]) -> str:
    """Efficiency at the largest N, and in brackets the largest N up to which it stays >= 0.9."""
    keeps = largest_n(plan, lambda n: compute_s / (compute_s + comm(n)) >= TARGET)
    return f"{fmt_eff(compute_s / (compute_s + comm(plan.workers[-1])))} ({keeps})"


def remedies_section(plan: Plan) -> list[str]:
    """Each remedy's efficiency at the largest N, and the largest N that keeps 0.9 with it."""
    top = plan.workers[-1]
    lines = [f"### What recovers efficiency: each remedy at N = {top} (in brackets: the largest N that keeps 0.9)",
             "", f"fp16 halves S. Hierarchical allreduce with {plan.ranks_per_node} ranks per node: either a link of "
             "rate B per rank (the node's network capacity is G x B, so the inter-node bandwidth term falls by G) or "
             "one link of rate B shared by the node's ranks (only the latency term falls). 'Batch for 0.9' is the "
             "per-worker batch whose compute (a line through the measured batches) reaches 0.9 with the plain fp32 "
             "allreduce, and the global batch it makes. 'Fusion off' is what HOROVOD_FUSION_THRESHOLD=0 would cost: "
             "one allreduce per gradient tensor, each paying its own 2(N-1) alpha.", "",
             "| model | batch | link | as is | fp16 | hier., link per rank | hier., shared link | fp16 + hier. "
             "per rank | batch for 0.9 (global) | fusion off |", "|---|---:|---|---|---|---|---|---|---:|---|"]
    for model in MODELS:
        s32 = gradient_bytes(model)
        for batch in plan.batches:
            c = plan.compute_s[model][batch]
            for gbit in plan.links_gbit:
                comms = [partial(_remedy, plan, variant, model, gbit) for variant in REMEDIES]
                cells = [_eff_cell(plan, c, comm) for comm in comms]
                need = compute_for_efficiency(TARGET, plan.exposed(top, s32, gbit))
                wanted = math.ceil(batch_for(plan.compute_s[model], need))
                cells.append("-" if need <= c else f"{wanted:,} ({wanted * top:,})")
                extra_latency = (MODELS[model].gradient_tensors - 1) * 2 * (top - 1) * plan.alpha_s
                cells.append(fmt_eff(c / (c + plan.exposed(top, s32, gbit) + (1 - plan.overlap) * extra_latency)))
                lines.append(f"| {MODELS[model].label} | {batch} | {fmt_rate(gbit)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def paper_section(plan: Plan) -> list[str]:
    """The same model applied to the Horovod paper's Inception V3 and ResNet-101 on 25 GbE."""
    bandwidth = gbit_to_bytes_per_s(PAPER_LINK_GBIT)
    lines = ["### The Horovod paper's models under the same model", "",
             f"{PAPER_LINK_GBIT} Gbit/s, alpha {plan.alpha_s * 1e6:g} us, fp32 gradients, flat ring, no overlap. "
             "'Overlap for 0.88' is the fraction of the allreduce that must be hidden behind the backward pass for "
             "the paper's 88%.", "",
             "| model | S (fp32) | batch per GPU | compute s/step (P100) | N | allreduce ms | efficiency, no overlap "
             "| overlap for 0.88 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, params, per_batch in PAPER_MODELS:
        size = params * 4
        for batch, compute_s in sorted(per_batch.items()):
            for n in (128, 512):
                t = ring_allreduce_seconds(n, size, bandwidth, plan.alpha_s)
                hidden = max(0.0, 1 - (compute_s / PAPER_EFFICIENCY - compute_s) / t)
                lines.append(f"| {name} | {size / 1e6:.0f} MB | {batch} | {compute_s:.3f} | {n} | {fmt_ms(t)} | "
                             f"{compute_s / (compute_s + t):.3f} | {hidden:.2f} |")
    return [*lines, ""]


def _step_compute(plan: Plan, entry: dict) -> float:
    if "compute_ms" in entry:
        return float(entry["compute_ms"]) / 1000
    return compute_at(plan.compute_s[entry["model"]], entry["batch"])


def predicted(plan: Plan, entry: dict) -> float:
    """A measured entry's prediction with its link's alpha and B: the allreduce, plus the compute for a step."""
    fit = plan.fits[_link_key(entry)]
    comm = ring_allreduce_seconds(entry["n"], entry["size_bytes"], fit.bandwidth, fit.alpha_s)
    return comm if entry["kind"] == "allreduce" else _step_compute(plan, entry) + comm


def _what(entry: dict) -> str:
    what = f"{MODELS[entry['model']].label} {entry['kind']}"
    if entry["kind"] == "step":
        what += f", batch {entry['batch']}"
    what += ", fp16" if entry["fp16"] else ", fp32"
    return what + (f", {entry['launcher']}" if entry["launcher"] else "")


def measured_section(plan: Plan) -> list[str]:
    """Measured against predicted on the shaped links; a TODO table of nominal predictions until there are any."""
    header = ["| N | link rate | what | measured s | predicted s | error |", "|---:|---:|---|---:|---:|---:|"]
    if not plan.measured:
        lines = ["**TODO: not measured yet.** The rows below are to be replaced by the shaped-link runs of issue 24 "
                 "(`--inputs` with `measured`). Until then the predicted column uses the nominal rate as B and "
                 "alpha = 0 (one rank per namespace, each host's sending side shaped by tbf); after the runs, alpha "
                 "and B are fitted per link from the allreduce runs and the rest is predicted from them.", "", *header]
        for mbit, fp16 in ((1000, False), (200, False), (20, False), (200, True)):
            size = gradient_bytes("mlp", fp16)
            for n in (2, 3, 4):
                t = ring_allreduce_seconds(n, size, mbit * 1e6 / 8, 0.0)
                what = f"MLP allreduce, {'fp16' if fp16 else 'fp32'}"
                lines.append(f"| {n} | {fmt_rate(mbit / 1000)} | {what} | TODO | {t:.3g} (nominal) | TODO |")
        return [*lines, ""]
    lines = ["| link | alpha | B | B / nominal rate | from |", "|---|---:|---:|---:|---|"]
    for key, fit in plan.fits.items():
        nominal = float(key.split("/")[0]) * 1e6 / 8
        lines.append(f"| {key.replace('/', ' Mbit/s, ', 1) if '/' in key else key + ' Mbit/s'} | "
                     f"{fit.alpha_s * 1e6:.1f} us | {fit.bandwidth / 1e6:.3g} MB/s | {fit.bandwidth / nominal:.2f} | "
                     f"{fit.how} |")
    lines += ["", *header]
    errors = []
    for entry in sorted(plan.measured, key=lambda e: (-e["link_mbit"], e["kind"], e["fp16"], e["n"])):
        guess = predicted(plan, entry)
        errors.append(guess / entry["seconds"] - 1)
        lines.append(f"| {entry['n']} | {fmt_rate(entry['link_mbit'] / 1000)} | {_what(entry)} | "
                     f"{entry['seconds']:.3g} | {guess:.3g} | {errors[-1]:+.1%} |")
    within = sum(abs(e) <= 0.25 for e in errors)
    lines += ["", f"{within} of {len(errors)} within +-25% of the prediction; largest error "
              f"{max(errors, key=abs):+.1%}.", ""]
    return lines


def generated(plan: Plan) -> dict[str, list[str]]:
    """The two generated blocks of docs/scaling.md, without their markers."""
    plan_lines = [*inputs_section(plan), *allreduce_section(plan), *step_section(plan, plan.compute_s, "CPU")]
    if plan.gpu_compute_s:
        plan_lines += step_section(plan, plan.gpu_compute_s, "GPU, given and not measured")
    plan_lines += [*remedies_section(plan), *paper_section(plan)]
    return {"plan": plan_lines, "measured": measured_section(plan)}


def with_markers(blocks: dict[str, list[str]]) -> str:
    """The blocks as text, each between its markers, so that the output can be pasted into a doc and updated."""
    parts = []
    for name, lines in blocks.items():
        begin, end = MARKERS[name]
        parts.append("\n".join([begin, "", *lines, end]))
    return "\n\n".join(parts) + "\n"


def update(doc: Path, blocks: dict[str, list[str]]) -> None:
    """Replace each generated block of `doc` between its markers, leaving the hand-written text as it is."""
    text = doc.read_text()
    for name, lines in blocks.items():
        begin, end = MARKERS[name]
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start:
            raise SystemExit(f"scaling_plan: error: {doc} lacks the markers {begin} ... {end}")
        text = text[:start] + "\n".join([begin, "", *lines, end]) + text[stop + len(end):]
    doc.write_text(text)


def chart(plan: Plan, path: Path) -> None:
    """Predicted efficiency against N per model (link rate by colour, batch by line style), measured points on it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(MODELS) + (1 if plan.measured else 0)
    fig, axes = plt.subplots(1, panels, figsize=(6.6 * panels, 5.2), squeeze=False)
    styles = dict(zip(sorted(plan.batches), ["--", "-", "-.", (0, (5, 1))], strict=False))
    link_colours = {key: f"C{3 + i}" for i, key in enumerate(plan.fits)}
    for ax, model in zip(axes[0], MODELS, strict=False):
        size = gradient_bytes(model)
        for i, gbit in enumerate(plan.links_gbit):
            for batch in plan.batches:
                c = plan.compute_s[model][batch]
                effs = [c / (c + plan.exposed(n, size, gbit)) for n in plan.workers]
                ax.plot(plan.workers, effs, color=f"C{i}", linestyle=styles[batch], marker="o", markersize=3,
                        label=f"{fmt_rate(gbit)}, batch {batch}")
            for batch, c in sorted(plan.gpu_compute_s.get(model, {}).items()):
                effs = [c / (c + plan.exposed(n, size, gbit)) for n in plan.workers]
                ax.plot(plan.workers, effs, color=f"C{i}", linestyle=":", marker="x", markersize=4,
                        label=f"{fmt_rate(gbit)}, GPU batch {batch} (given)")
        for entry in (e for e in plan.measured if e["model"] == model and e["kind"] == "step"):
            c = _step_compute(plan, entry)
            colour = link_colours[_link_key(entry)]
            ax.plot([entry["n"]], [c / entry["seconds"]], linestyle="none", marker="s", color=colour,
                    markeredgecolor="black", label=f"measured: {_what(entry)}, {entry['link_mbit']:g} Mbit/s")
            fit = plan.fits[_link_key(entry)]
            ns = list(range(2, max(e["n"] for e in plan.measured) + 1))
            ax.plot(ns, [c / (c + ring_allreduce_seconds(n, entry["size_bytes"], fit.bandwidth, fit.alpha_s))
                         for n in ns], color=colour, linewidth=0.8, linestyle="--")
        ax.axhline(TARGET, color="black", linestyle=(0, (1, 2)), linewidth=1.2, label="0.9 target")
        ax.set_xscale("log", base=2)
        ax.set_xticks(plan.workers)
        ax.set_xticklabels([str(n) for n in plan.workers])
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("workers N (per-worker batch fixed)")
        ax.set_ylabel("predicted efficiency = compute / step")
        placeholder = " (compute: PLACEHOLDER)" if plan.compute_source[model] == LENET5_SOURCE else ""
        ax.set_title(f"{MODELS[model].label}, CPU compute{placeholder}\nring allreduce, alpha "
                     f"{plan.alpha_s * 1e6:g} us, no overlap", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    if plan.measured:
        ax = axes[0][-1]
        groups: dict[tuple, list[dict]] = {}
        for entry in plan.measured:
            key = (_link_key(entry), entry["kind"], entry["model"], entry["fp16"], entry.get("batch"))
            groups.setdefault(key, []).append(entry)
        for (link, *_), entries in groups.items():
            entries.sort(key=lambda e: e["n"])
            colour = link_colours[link]
            marker = "o" if entries[0]["kind"] == "allreduce" else "s"
            ax.plot([e["n"] for e in entries], [e["seconds"] for e in entries], linestyle="none", marker=marker,
                    color=colour, label=f"{_what(entries[0])}, {entries[0]['link_mbit']:g} Mbit/s")
            ax.plot([e["n"] for e in entries], [predicted(plan, e) for e in entries], color=colour, linewidth=1,
                    marker="_", markersize=14)
        ax.set_yscale("log")
        ax.set_xticks(sorted({e["n"] for e in plan.measured}))
        ax.set_xlabel("ranks N (one per shaped host)")
        ax.set_ylabel("seconds")
        ax.set_title("shaped links: measured (markers) against the model (lines, bars)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _gpu_flag(text: str) -> tuple[str, int, float]:
    try:
        key, ms = text.split("=")
        model, batch = key.split(":")
        if model not in MODELS:
            raise ValueError
        return model, int(batch), float(ms)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MODEL:BATCH=MS with MODEL one of {', '.join(MODELS)}, "
                                         f"e.g. mlp:100=0.4; got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags; --help prints the module docstring, which documents --inputs' keys."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=Path, metavar="FILE", help="JSON of inputs replacing the built-in ones")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--out", type=Path, metavar="FILE", help="write the generated blocks (with markers) to FILE")
    out.add_argument("--update", type=Path, metavar="DOC",
                     help="rewrite the generated blocks of DOC in place (e.g. docs/scaling.md)")
    parser.add_argument("--chart", type=Path, metavar="PNG", help="also draw the chart (e.g. docs/scaling_chart.png)")
    parser.add_argument("--gpu-compute-ms", type=_gpu_flag, nargs="+", default=[], metavar="MODEL:BATCH=MS",
                        help="GPU compute time per step per worker, e.g. mlp:100=0.4 lenet5:1000=3; adds GPU tables "
                             "and curves. Not measured here: no GPU has run this repo's benchmark yet")
    parser.add_argument("--alpha-us", type=float, help="per-message latency alpha in microseconds (default 5)")
    parser.add_argument("--overlap", type=float, help="fraction of the allreduce hidden behind the backward pass "
                                                      "(default 0, Horovod with these small models)")
    parser.add_argument("--print-defaults", action="store_true", help="print the built-in inputs as JSON and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Resolve the inputs, write the blocks where asked and draw the chart; 2 on bad inputs."""
    args = parse_args(argv)
    if args.print_defaults:
        print(json.dumps({"_comment": "inputs for scripts/scaling_plan.py --inputs; LeNet-5's compute_ms, when "
                                      "absent, is the MLP's x the FLOPs ratio (a placeholder)",
                          **default_inputs()}, indent=2))
        return 0
    inputs = json.loads(args.inputs.read_text()) if args.inputs else {}
    if args.alpha_us is not None:
        inputs["alpha_s"] = args.alpha_us * 1e-6
    if args.overlap is not None:
        inputs["overlap"] = args.overlap
    for model, batch, ms in args.gpu_compute_ms:
        inputs.setdefault("gpu_compute_ms", {}).setdefault(model, {})[str(batch)] = ms
    try:
        plan = resolve(inputs)
    except (ValueError, KeyError, TypeError) as error:
        print(f"scaling_plan: error: bad inputs: {error}", file=sys.stderr)
        return 2
    blocks = generated(plan)
    if args.update:
        update(args.update, blocks)
    elif args.out:
        args.out.write_text(with_markers(blocks))
    else:
        sys.stdout.write(with_markers(blocks))
    if args.chart:
        chart(plan, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
