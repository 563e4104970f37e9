"""Measure hvd_mnist against its peers and the compute floor, side by side, in one invocation.

    .venv/bin/python scripts/benchmark.py [--out bench_out/] [--repeats 3] [--steps 300] [--quick]
                                          [--time-to-accuracy [--tta-target 0.85] [--tta-eval-every 50]
                                           [--tta-max-steps 3000] [--tta-lr 0.1]] [--gpu]
    .venv/bin/python scripts/benchmark.py --shaped-links [--out bench_out/]
    .venv/bin/python scripts/benchmark.py --publish [bench_out/results.json]

Converts the offline MNIST sample to TFRecords (and an npz copy for the peers) once, then runs every
configuration `--repeats` times, interleaved, at per-worker batches 100 and 1000, with the first fifth of
the steps excluded as warm-up. Every job runs under a time limit; multi-process jobs run in a private
network namespace holding only the loopback interface when `unshare --net` works here. Writes
OUT/results.json (every raw figure, medians, spreads, ratios, targets, machine and versions) and
OUT/chart.png, and prints a table. See docs/benchmark.md. --publish copies a results.json to docs/ and
rewrites the README's and docs/benchmark.md's results sections and the chart from it (bench/published.py).

--time-to-accuracy then races, on Fashion-MNIST at per-worker batch 100 and np=2, hvd_mnist (the faster
launcher at batch 100) against PyTorch DDP, Horovod's example and the fastest peer at batch 100 (when it is
another). Each is launched once, holds out the same
5,000 training examples (hvd_mnist's own hold-out, seed 0) and trains on the rest, evaluates on them every
--tta-eval-every steps, and stops when its validation accuracy reaches --tta-target (or at --tta-max-steps);
the race is decided on wall time from launch to exit, which is also shown in phases (launcher, interpreter,
framework import, rendezvous, data, first step, training, validation, test, export, exit).
"""

# This file parses the flags and runs the steps in order (--help prints the docstring above). The work is in
# scripts/bench/: configs (what runs, how its figures are read), launching (the jobs), runs (data, repeats), stats
# (medians, ratios, targets), report (table, chart, results.json) and race (time to accuracy).

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench import published, shaped
from bench.configs import HVD_NP2, cpu_configs, gpu_configs, plan_for
from bench.launching import ROOT, gpu_present, network_namespace_works
from bench.race import TTA_BATCH, race_possible, race_targets, time_to_accuracy
from bench.report import chart, machine, table, write_results
from bench.runs import measure, prepare_data
from bench.stats import derive, summarize, targets


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, with --quick's defaults filled in and the combinations that cannot run refused."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "bench_out", help="output folder (default: bench_out/)")
    parser.add_argument("--repeats", type=int, help="runs of each configuration (default 3; --quick: 1)")
    parser.add_argument("--steps", type=int, help="steps per run, the first fifth untimed (default 300; --quick: 100)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="per worker (default 100 1000; --quick: 100)")
    parser.add_argument("--quick", action="store_true", help="one short repeat at batch 100 (under 3 minutes)")
    parser.add_argument("--time-to-accuracy", action="store_true",
                        help="then race hvd_mnist np=2 against PyTorch DDP, Horovod's example and the best peer "
                             "at batch 100 to --tta-target on Fashion-MNIST, one run each, timed from launch to "
                             "exit in phases (needs batch 100)")
    parser.add_argument("--tta-target", type=float, default=0.85,
                        help="validation accuracy at which a racer stops (default 0.85)")
    parser.add_argument("--tta-eval-every", type=int, default=50,
                        help="steps between the racers' validations (default 50)")
    parser.add_argument("--tta-max-steps", type=int, default=3000,
                        help="steps after which a racer that has not reached the target stops (default 3000)")
    parser.add_argument("--tta-lr", type=float, default=0.1, help="learning rate of the racers (default 0.1)")
    parser.add_argument("--gpu", action="store_true", help="the GPU variant: np=1 on one GPU, mixed precision off/on")
    parser.add_argument("--timeout", type=int, default=300, help="seconds allowed to each job (default 300)")
    parser.add_argument("--shaped-links", action="store_true",
                        help="instead: N = 2, 3, 4 ranks on as many network-namespace hosts, links shaped to 1000, "
                             "200 and 20 Mbit/s; allreduce and training steps against the ring model (~10 min, "
                             "root; writes OUT/shaped_links.json; docs/scaling.md)")
    parser.add_argument("--publish", nargs="?", type=Path, const=published.RESULTS, metavar="RESULTS_JSON",
                        help="instead: copy RESULTS_JSON to docs/results.json (default: keep that one) and write "
                             "the docs' results sections and docs/benchmark_chart.png from it")
    parser.add_argument("--only", nargs="+", metavar="KEY", default=[],
                        help="run only these configurations, by results.json key (e.g. floor hvd_np1)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.repeats = args.repeats or (1 if quick else 3)
    args.steps = args.steps or (100 if quick else 300)
    args.batch_sizes = args.batch_sizes or ([100] if quick else [100, 1000])
    if args.repeats < 1 or args.steps < 5 or min(args.batch_sizes) < 1:
        parser.error("--repeats, --batch-sizes must be positive and --steps at least 5")
    if args.time_to_accuracy and TTA_BATCH not in args.batch_sizes:
        parser.error(f"--time-to-accuracy picks its racers by their throughput at batch {TTA_BATCH}: "
                     f"keep {TTA_BATCH} in --batch-sizes")
    if not 0 < args.tta_target <= 1 or not 1 <= args.tta_eval_every <= args.tta_max_steps:
        parser.error("--tta-target must be in (0, 1] and --tta-eval-every in 1..--tta-max-steps")
    args.out = args.out.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, race if asked, write results.json and the chart; 1 if any run failed."""
    args = parse_args(argv)
    if args.publish:
        for path in published.publish(args.publish):
            print(f"wrote {path}")
        return 0
    if args.shaped_links:
        return shaped.run(args.out, args.timeout)
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
    train, _ = prepare_data(args.out, "mnist", args.timeout)
    plan = plan_for(train, steps=args.steps, timeout=args.timeout, isolate=isolate, gpu=args.gpu)
    records = measure(plan, configs, args.batch_sizes, args.repeats, args.out / "runs")
    summary = summarize(records)
    derived = derive(summary, configs, args.batch_sizes)
    print(table(summary, derived, configs, args.batch_sizes), flush=True)
    race = time_to_accuracy(args, configs, summary, isolate) if racing else None
    results = {
        "machine": machine(),
        "settings": {"repeats": args.repeats, "steps": args.steps, "warmup_steps": plan.warmup,
                     "batch_sizes": args.batch_sizes, "quick": args.quick, "gpu": args.gpu,
                     "loopback_only_network_namespace": isolate},
        "configs": {c.key: {"label": c.label, "group": c.group, "launcher": c.launcher, "np": c.np_}
                    for c in configs},
        "runs": records, "summary": summary, "derived": derived,
        "targets": {} if args.gpu else (targets(summary, derived, configs, args.batch_sizes)
                                        | race_targets(race)),
    }
    if race:
        results["time_to_accuracy"] = race
    results["duration_s"] = time.perf_counter() - started
    write_results(args.out / "results.json", results)
    chart(summary, configs, args.batch_sizes, args.out / "chart.png")
    for name, target in results["targets"].items():
        print(f"target {name}: {'met' if target['met'] else 'MISSED' if target['met'] is False else 'not measured'}")
    failures = [record for record in [*records, *(race or {}).get("contenders", {}).values()] if "error" in record]
    print(f"wrote {args.out / 'results.json'} and {args.out / 'chart.png'} in {results['duration_s']:.0f}s"
          + (f"; {len(failures)} run(s) failed" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

