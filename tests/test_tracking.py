"""Experiment tracking: a 2-rank run logged to MLflow by rank 0 alone, read back with MLflow's own client; an
unreachable tracking server is one warning and the run goes on."""

from __future__ import annotations

import pytest
from helpers import read_metrics, run_trainer

pytestmark = pytest.mark.slow


def test_rank_0_tracks_the_run_in_mlflow(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file stores behind a switch
    from mlflow.tracking import MlflowClient

    store, run_dir = f"file://{tmp_path / 'mlruns'}", tmp_path / "run"
    run_trainer("gloo", 2, "--steps", "200", "--log-every", "50", "--eval-every", "100", "--mlflow", store,
                "--output-dir", str(run_dir))
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("hvd_mnist")
    (run,) = client.search_runs([experiment.experiment_id])  # one run: rank 1 logged nothing
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    params = run.data.params
    assert (params["batch-size"], params["steps"], params["model"]) == ("100", "200", "mlp")
    assert params["export_path"] == str(run_dir / "export")
    history = {name: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)]
               for name in ("loss", "validation_accuracy", "examples_per_second")}
    events = read_metrics(run_dir)
    assert history["loss"] == [(e["step"], pytest.approx(e["loss"])) for e in events if e["event"] == "train"]
    assert [step for step, _ in history["loss"]] == [50, 100, 150, 200]
    assert [step for step, _ in history["validation_accuracy"]] == [100, 200]
    assert run.data.metrics["test_accuracy"] == pytest.approx(events[-1]["test_accuracy"])


def test_a_run_that_fails_is_failed_in_mlflow(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    store = f"file://{tmp_path / 'mlruns'}"
    proc = run_trainer("python", 1, "--steps", "100", "--log-every", "10", "--mlflow", store, "--output-dir",
                       str(tmp_path / "run"), check=False, extra_env={"HVD_MNIST_FAULT": "step:rank=0:step=25:raise"})
    assert proc.returncode == 1 and "injected failure at step 25" in proc.stderr
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("hvd_mnist").experiment_id])
    assert run.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [10, 20]


def test_an_unreachable_tracking_server_is_a_warning_and_training_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_trainer("python", 1, "--steps", "20", "--mlflow", "http://127.0.0.1:1", "--output-dir", str(run_dir))
    warnings = [line for line in proc.stderr.splitlines() if "MLflow at http://127.0.0.1:1: could not" in line]
    assert len(warnings) == 1 and "training goes on without tracking" in warnings[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert read_metrics(run_dir)[-1]["event"] == "end"
