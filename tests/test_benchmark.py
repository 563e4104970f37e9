"""scripts/benchmark.py end to end on tiny settings: its outputs exist and are well-formed (not its speeds), the
race's phases included; and how it decides the time-to-accuracy race, on made-up records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from scripts.bench import published
from scripts.bench.configs import Config, cpu_configs, plan_for, read_result
from scripts.bench.phases import PHASES, durations
from scripts.bench.race import RIVALS, race_contenders, race_possible, race_target, race_targets
from scripts.bench.report import write_results
from scripts.bench.runs import run_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def racer(wall_s: float, reached: bool = True) -> dict:
    """A racer's record as run_config returns it."""
    return {"wall_s": wall_s, "figures": {"steps": 900, **({"steps_to_target": 900} if reached else {})}}


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory) -> Path:
    """One quick benchmark run with 10 steps per configuration, and a race to 50% that lasts at most 40 steps."""
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "benchmark.py"), "--quick", "--steps", "10",
                           "--time-to-accuracy", "--tta-target", "0.5", "--tta-eval-every", "20",
                           "--tta-max-steps", "40", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert "examples/s" in proc.stdout
    (out / "stdout.txt").write_text(proc.stdout)
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
    derived = results["derived"]["100"]
    assert derived["best_peer"] in results["configs"]
    for key in ("hvd_np2_gloo", "hvd_np2_mpirun"):  # true efficiency = trainer's work x collective efficiency
        assert derived["true_efficiency"][key] == pytest.approx(
            derived["trainer_work_vs_floor_1core"] * derived["collective_efficiency"][key])
    assert all("met" in target for target in results["targets"].values())


@pytest.mark.slow
def test_its_results_can_be_published_with_every_target_in_words(bench_out):
    results = json.loads((bench_out / "results.json").read_text())
    sections = published.sections(results)  # a target with no words in published.target_words raises
    assert f"of {len(results['targets'])} met" in sections["readme"]
    assert all(f"- `{name}`: " in sections["benchmark"] for name in results["targets"])


@pytest.mark.slow
def test_every_racer_has_every_phase_from_launch_to_exit(bench_out):
    race = json.loads((bench_out / "results.json").read_text())["time_to_accuracy"]
    assert {"hvd_mnist", *RIVALS} <= race["contenders"].keys()
    for role, record in race["contenders"].items():
        phases = record["phases"]
        assert list(phases) == list(PHASES), role
        measured = {phase: seconds for phase, seconds in phases.items() if seconds is not None}
        assert sum(measured.values()) == pytest.approx(record["wall_s"], abs=0.05), role
        assert min(measured.values()) > -0.05, (role, phases)  # the process start is known to 10 ms
        for phase in ("framework_import", "first_step", "training", "test"):
            assert phases[phase] > 0, (role, phase)
    assert race["contenders"]["hvd_mnist"]["phases"]["export"] > 0  # the peers export nothing: None
    assert "launch to exit, s" in (bench_out / "stdout.txt").read_text()


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


@pytest.mark.parametrize(("hvd", "peer", "met", "ratio"), [
    (racer(10), racer(12), True, 10 / 12),
    (racer(12), racer(12), True, 1.0),
    (racer(15), racer(12), False, 15 / 12),
    (racer(15, reached=False), racer(12), False, None),  # only the peer got there
    (racer(15), racer(12, reached=False), True, None),  # only hvd_mnist got there
    (racer(15, reached=False), racer(12, reached=False), None, None),  # nobody did: nothing decided
    ({"error": "exit 1"}, racer(12), None, None),  # a failed run decides nothing
])
def test_time_to_accuracy_target_compares_wall_time_to_the_target(hvd, peer, met, ratio):
    target = race_target({"contenders": {"hvd_mnist": hvd, "peer_torch_ddp": peer}}, "peer_torch_ddp", within=1.0)
    assert target["met"] is met
    assert target["ratio"] == (pytest.approx(ratio) if ratio else None)


def test_time_to_accuracy_target_is_not_measured_without_a_race():
    assert race_target(None, "peer_torch_ddp")["met"] is None


def test_a_time_to_accuracy_target_of_0_75x_needs_a_quarter_off_the_rivals_wall_time():
    race = {"contenders": {"hvd_mnist": racer(9), "peer_torch_ddp": racer(12), "peer_hvd_example": racer(11)}}
    assert race_target(race, "peer_torch_ddp")["met"] is True  # 9 <= 0.75 x 12
    assert race_target(race, "peer_hvd_example")["met"] is False  # 9 > 0.75 x 11


def test_phases_add_up_to_the_wall_time_and_take_validation_out_of_training():
    marks = {"interpreter": 0.3, "framework_imported": 4.0, "rendezvous_done": 4.5, "data_ready": 5.0,
             "first_step": 6.0, "trained": 10.0, "tested": 10.5}  # no "exported": a peer
    phases = durations(launched_at=100.0, wall_s=12.0, started_at=100.5, marks=marks, evaluation_s=1.0)
    assert phases == {"launcher": 0.5, "interpreter": 0.3, "framework_import": 3.7, "rendezvous": 0.5, "data": 0.5,
                      "first_step": 1.0, "training": 3.0, "test": 0.5, "export": None, "evaluation": 1.0,
                      "exit": 1.0}


def test_racers_are_the_faster_hvd_launcher_the_rivals_keras_fit_and_the_fastest_peer_at_batch_100():
    configs = cpu_configs()
    rates = {"hvd_np2_gloo": 20_000, "hvd_np2_mpirun": 44_000, "peer_mwms": 29_000, "peer_torch_ddp": 27_000,
             "peer_hvd_example": 15_000}
    summary = {key: {100: {"examples_per_sec": {"median": rate}}} for key, rate in rates.items()}
    racers = {role: config.key for role, config in race_contenders(summary, configs).items()}
    assert racers == {"hvd_mnist": "hvd_np2_mpirun", "peer_torch_ddp": "peer_torch_ddp",
                      "peer_hvd_example": "peer_hvd_example", "peer_keras_fit": "peer_keras_fit",
                      "peer_mwms": "peer_mwms"}
    assert set(race_targets(None)) == {"time_to_accuracy_within_0.75x_peer_torch_ddp",
                                       "time_to_accuracy_within_0.75x_peer_hvd_example"}  # none for Keras fit
    assert race_contenders({}, configs)["hvd_mnist"] is None
    assert not race_possible([c for c in configs if c.key in ("floor", "peer_torch_ddp")])


def test_results_json_keys_batches_as_strings_and_the_allreduce_as_any(tmp_path):
    stats = {"examples_per_sec": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1}}
    results = {"summary": {"floor": {100: stats}, "allreduce_gloo": {None: stats}}, "derived": {100: {}}}
    write_results(tmp_path / "results.json", results)
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["summary"] == {"floor": {"100": stats}, "allreduce_gloo": {"any": stats}}
    assert written["derived"] == {"100": {}}
    assert 100 in results["summary"]["floor"]  # the caller's int keys are left as they were


def test_a_run_never_reads_what_an_earlier_benchmark_left_in_its_run_directory(tmp_path):
    run_dir = tmp_path / "runs" / "silent-b100-r0"
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps({"examples_per_sec": 1e9}))  # the earlier run's figures
    (run_dir / "torch_store").write_text("stale rendezvous")
    silent = Config("silent", "a job that exits 0 and writes nothing", "floor", "python", 1,
                    lambda *_: ["-c", "pass"], read_result)
    record = run_config(plan_for(tmp_path / "data"), silent, 100, run_dir)
    assert "figures" not in record and "result.json" in record["error"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["log.txt"]
