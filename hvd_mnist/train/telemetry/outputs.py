"""A rank's outputs, built in one place from the configuration: rank 0's progress lines, metrics.jsonl,
TensorBoard, --metrics-port's Prometheus endpoint, --mlflow's tracking and the straggler warning. The other
ranks get outputs that do nothing, so the loop tells its outputs everything and never asks which rank it is."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

from hvd_mnist.config import TrainConfig
from hvd_mnist.errors import WriteFailed
from hvd_mnist.runtime.supervisor import RunDir, Supervisor, World
from hvd_mnist.train.telemetry.reporting import Console, MetricsFile, Output, TensorBoard
from hvd_mnist.train.telemetry.stragglers import Stragglers


class Outputs:
    """What the loop emits to: every event, scalar and histogram goes to each output (none: nothing happens)."""

    def __init__(self, outputs: Sequence[Output] = (), stragglers: Stragglers | None = None) -> None:
        self._outputs = outputs
        self._stragglers = stragglers

    def event(self, kind: str, **fields: Any) -> None:
        for output in self._outputs:
            output.event(kind, fields)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for output in self._outputs:
            output.scalars(step, values)

    def histograms(self, step: int, tensors: dict[str, tf.Tensor]) -> None:
        for output in self._outputs:
            output.histograms(step, tensors)

    def paces(self, step: int, paces: list[tuple[float, float]]) -> None:
        """One full pace's (compute, allreduce wait) per rank: a rank that keeps the others waiting is named once."""
        straggler = self._stragglers.observe(paces) if self._stragglers is not None else None
        if straggler:
            self.event("straggler", step=step, message=straggler)

    def close(self) -> None:
        """Close the outputs in the reverse of the order they opened in."""
        for output in reversed(self._outputs):
            output.close()


class Telemetry:
    """The factory of a rank's outputs. Prometheus's endpoint and the MLflow run start once per process, the
    first time it is rank 0, and outlive an elastic reset; the files open for each run of the loop."""

    def __init__(self, config: TrainConfig, run_dir: RunDir, supervisor: Supervisor) -> None:
        self.config = config
        self.run_dir = run_dir
        self.supervisor = supervisor
        self._watchers: list[Output] | None = None
        self._stragglers = Stragglers()

    @contextlib.contextmanager
    def outputs(self, world: World) -> Iterator[Outputs]:
        """This rank's outputs for the block, closed once at its end; a run already failing keeps its first cause
        even if closing fails too."""
        outputs = self._build(world)
        try:
            yield outputs
        except BaseException:
            with contextlib.suppress(WriteFailed):
                outputs.close()
            raise
        outputs.close()

    def _build(self, world: World) -> Outputs:
        if not world.is_chief:  # HVD: only rank 0 reports (every rank holds the same averaged figures)
            return Outputs()
        return Outputs([Console(self.config.steps), *self._watching(), MetricsFile(self.run_dir.metrics),
                        TensorBoard(self.run_dir.events)], self._stragglers)

    def _watching(self) -> list[Output]:
        """The outside watchers, started on first use: --metrics-port's Prometheus endpoint and --mlflow's
        tracking (imported only when asked for, off the default start-up path)."""
        if self._watchers is None:
            self._watchers = []
            if self.config.metrics_port is not None:
                from hvd_mnist.train.telemetry.monitoring import PrometheusMetrics

                self._watchers.append(PrometheusMetrics(self.config.metrics_address, self.config.metrics_port,
                                                        self.supervisor.liveness))
            if self.config.mlflow is not None:
                from hvd_mnist.train.telemetry.tracking import MlflowTracker

                self._watchers.append(MlflowTracker(self.config.mlflow, self.config, self.run_dir.path,
                                                    self.run_dir.export))
        return self._watchers
