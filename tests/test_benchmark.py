"""scripts/benchmark.py end to end on tiny settings: its outputs exist and are well-formed (not its speeds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory) -> Path:
    """One quick benchmark run with 10 steps per configuration."""
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "benchmark.py"), "--quick", "--steps", "10",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert "examples/s" in proc.stdout
    return out


@pytest.mark.slow
def test_results_json_has_every_configuration_with_positive_figures(bench_out):
    results = json.loads((bench_out / "results.json").read_text())
    assert {"machine", "settings", "configs", "runs", "summary", "derived", "targets"} <= results.keys()
    assert results["machine"]["cores"] >= 1
    assert {"tensorflow-cpu", "horovod", "torch", "numpy"} <= results["machine"]["versions"].keys()
    assert results["machine"]["python"]
    for key, config in results["configs"].items():
        batches = results["summary"][key]
        assert batches, key
        figures = next(iter(batches.values()))
        wanted = ("sec_per_call", "algbw_gbytes_per_sec") if config["group"] == "allreduce" else (
            "examples_per_sec", "sec_per_batch")
        for name in wanted:
            assert figures[name]["median"] > 0, (key, name)
    assert all("error" not in run and run["wall_s"] > 0 for run in results["runs"])
    assert results["derived"]["100"]["best_peer"] in results["configs"]
    assert all("met" in target for target in results["targets"].values())


@pytest.mark.slow
def test_chart_is_a_png(bench_out):
    assert (bench_out / "chart.png").read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.slow
def test_gpu_mode_fails_in_one_line_without_a_gpu(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_benchmark.sh"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        pytest.skip("this machine has a GPU")
    assert len(proc.stderr.strip().splitlines()) == 1 and "error" in proc.stderr
