"""Watching a run from outside: rank 0 serves Prometheus metrics (--metrics-port), the training figures it
reports, each rank's compute and allreduce wait per step, and, read at each scrape, every rank's last step and
how long since it was last heard and last progressed."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hvd_mnist.errors import UserError
from hvd_mnist.runtime.supervisor import RankLiveness
from hvd_mnist.train.telemetry.metrics_endpoint import MetricsEndpoint
from hvd_mnist.train.telemetry.reporting import Output

# What the Supervisor knows: {rank: (last step, seconds since heard)} and the last good checkpoint's path.
Liveness = Callable[[], tuple[dict[int, RankLiveness], str | None]]
GAUGES = {  # metrics.jsonl event -> {its field: the gauge it sets}
    "train": {"step": "step", "loss": "loss", "accuracy": "train_accuracy", "lr": "learning_rate",
              "examples_per_sec": "examples_per_second"},
    "eval": {"accuracy": "validation_accuracy"},
}
HELP = {
    "step": "global step of the last progress report",
    "loss": "training loss averaged over the ranks",
    "train_accuracy": "training accuracy averaged over the ranks",
    "validation_accuracy": "validation accuracy of the moving-average weights",
    "learning_rate": "learning rate of the last step",
    "examples_per_second": "training examples per second over all ranks",
}
PER_RANK = {  # the train event's per-rank lists, in ms -> the gauge (in seconds) each sets by rank
    "rank_compute_ms": ("rank_compute_seconds", "each rank's own compute per step (the step less its allreduce "
                                                "wait): a straggler's stands out"),
    "rank_allreduce_wait_ms": ("rank_allreduce_wait_seconds", "each rank's time per step in the gradient "
                                                              "allreduce, mostly waiting for the slowest rank"),
}

MEMORY = {  # a rank's memory report (resources.memory_report), from its last heartbeat -> the gauge it sets
    "rss": ("memory_bytes", "each rank's resident memory"),
    "peak": ("memory_peak_bytes", "each rank's peak resident memory"),
    "limit": ("memory_limit_bytes", "each rank's share of its tightest memory limit (a cgroup's, an rlimit, or "
                                    "the machine's available memory)"),
    "limit_used": ("memory_limit_used_bytes", "what each rank uses of that limit (a cgroup's working set, the "
                                              "address space for RLIMIT_AS): near the limit, the rank is killed "
                                              "or its allocations fail"),
}


class PrometheusMetrics(Output):
    """A /metrics endpoint of rank 0, set from the events written to metrics.jsonl."""

    def __init__(self, address: str, port: int, liveness: Liveness) -> None:
        self.registry = CollectorRegistry()
        self._gauges = {name: Gauge(f"hvd_mnist_{name}", text, registry=self.registry) for name, text in HELP.items()}
        self._per_rank = {field: Gauge(f"hvd_mnist_{name}", text, ["rank"], registry=self.registry)
                          for field, (name, text) in PER_RANK.items()}
        self.registry.register(_LivenessCollector(liveness))
        try:  # a daemon thread: serves until the process ends
            self.endpoint = MetricsEndpoint(address, port, lambda: generate_latest(self.registry))
        except OSError as err:
            reason = os.strerror(err.errno) if err.errno else err  # not create_server's added '(while ...)'
            raise UserError(f"--metrics-port {port}: cannot serve metrics on {address}: {reason}") from None

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        for field, gauge in GAUGES.get(kind, {}).items():
            if fields.get(field) is not None:
                self._gauges[gauge].set(fields[field])
        for field, gauge in self._per_rank.items() if kind == "train" else ():
            if fields.get(field):
                gauge.clear()  # an elastic world may have shrunk
                for rank, milliseconds in enumerate(fields[field]):
                    gauge.labels(str(rank)).set(milliseconds / 1e3)


class _LivenessCollector(Collector):
    """Read at each scrape, so a rank that went quiet shows its age growing while the others wait."""

    def __init__(self, liveness: Liveness) -> None:
        self._liveness = liveness

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ranks, checkpoint = self._liveness()
        steps = GaugeMetricFamily("hvd_mnist_rank_step", "last step each rank reported", labels=["rank"])
        ages = GaugeMetricFamily("hvd_mnist_rank_heartbeat_age_seconds",
                                 "seconds since rank 0 last heard each rank", labels=["rank"])
        progress = GaugeMetricFamily("hvd_mnist_rank_seconds_since_progress",
                                     "seconds since each rank's main thread last finished a step (grows while the "
                                     "heartbeat stays fresh: alive but stuck)", labels=["rank"])
        memory = {key: GaugeMetricFamily(f"hvd_mnist_rank_{name}", text, labels=["rank"])
                  for key, (name, text) in MEMORY.items()}
        for rank, liveness in sorted(ranks.items()):
            steps.add_metric([str(rank)], liveness.step)
            ages.add_metric([str(rank)], liveness.heartbeat_age)
            progress.add_metric([str(rank)], liveness.progress_age)
            for key, family in memory.items() if liveness.memory else ():
                family.add_metric([str(rank)], liveness.memory[key])
        yield from (steps, ages, progress, *memory.values())
        if checkpoint is not None:
            try:
                written = os.stat(f"{checkpoint}.index").st_mtime
            except OSError:
                return
            yield GaugeMetricFamily("hvd_mnist_seconds_since_checkpoint", "seconds since the last good checkpoint",
                                    value=time.time() - written)
