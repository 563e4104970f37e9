"""Experiment tracking with MLflow (--mlflow [URI]): rank 0 logs the configuration as parameters, the metrics
of every progress report and evaluation, the test accuracy and the export's path. A tracking server that
cannot be reached is a warning: training is what matters."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hvd_mnist.config import TrainConfig
from hvd_mnist.config_file import key
from hvd_mnist.errors import UserError, first_line
from hvd_mnist.train.telemetry.reporting import Output

log = logging.getLogger("hvd_mnist")
LOGGED = {  # metrics.jsonl event -> {its field: the MLflow metric}
    "train": {"loss": "loss", "accuracy": "train_accuracy", "lr": "learning_rate",
              "examples_per_sec": "examples_per_second"},
    "eval": {"accuracy": "validation_accuracy", "loss": "validation_loss"},
    "end": {"test_accuracy": "test_accuracy"},
}
ENDED = {"end": "FINISHED", "stopped": "KILLED"}


class MlflowTracker(Output):
    """One MLflow run for this training run, fed by the events written to metrics.jsonl (rank 0 only)."""

    def __init__(self, uri: str, config: TrainConfig, run_dir: Path, export: Path) -> None:
        try:
            import mlflow
        except ImportError:
            raise UserError("--mlflow needs MLflow: pip install 'hvd_mnist[mlflow]' (mlflow-skinny)") from None
        self._mlflow, self._uri, self._export = mlflow, uri, export
        # Bounded: MLflow's HTTP client otherwise retries an unreachable server for minutes.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        if "://" not in uri or uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file stores behind a switch
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        self.active = True
        with self._tolerated("start a run"):
            mlflow.set_tracking_uri(uri)
            mlflow.set_experiment("hvd_mnist")
            mlflow.start_run(run_name=run_dir.name)
            mlflow.log_params(params(config))
            mlflow.set_tag("run_dir", str(run_dir))
        atexit.register(self._fail_if_unfinished)  # runs before MLflow's own, which would say FINISHED

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        if not self.active:
            return
        with self._tolerated(f"log the {kind} event"):
            values = {name: fields[field] for field, name in LOGGED.get(kind, {}).items()
                      if fields.get(field) is not None}
            if values:
                self._mlflow.log_metrics(values, step=int(fields.get("step", 0)))
            if kind == "end" and self._export.exists():
                self._mlflow.log_param("export_path", str(self._export))
            if kind in ENDED:
                self._mlflow.end_run(status=ENDED[kind])
                self.active = False

    def _fail_if_unfinished(self) -> None:
        """A process that ends without the run's end (an error, a failed rank) leaves its MLflow run FAILED."""
        if self.active:
            with self._tolerated("end the run"):
                self._mlflow.end_run(status="FAILED")
                self.active = False

    @contextlib.contextmanager
    def _tolerated(self, what: str) -> Iterator[None]:
        """A failure of MLflow (an unreachable server, a refused request) is one warning; then tracking stops."""
        try:
            yield
        except Exception as err:
            self.active = False
            log.warning("MLflow at %s: could not %s (%s); training goes on without tracking", self._uri, what,
                        first_line(err))


def params(config: TrainConfig) -> dict[str, str]:
    """The configuration as MLflow parameters, under the flags' names (as in config.toml)."""
    return {key(name): str(value) for name, value in dataclasses.asdict(config).items() if value is not None}
