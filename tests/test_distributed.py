"""Real multi-process training under horovodrun (Gloo and MPI) and mpirun, on the offline MNIST sample."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import tensorflow as tf
from helpers import BIN, TIMEOUT, launch_argv, launcher_env, read_metrics, run_trainer, trainer_command

pytestmark = pytest.mark.slow

SHORT_RUN = ("--steps", "60", "--lr", "0.1", "--log-every", "10", "--summary-every", "10",
             "--histogram-every", "30", "--checkpoint-every", "20")


def checkpoint_tensors(run_dir, step):
    """name -> value of every variable saved in ckpt-<step>."""
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints" / f"ckpt-{step}"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith(("model/", "ema/", "step/"))}


def event_tags(run_dir):
    files = list((run_dir / "events").glob("events.out.tfevents.*"))
    tags = {value.tag for path in files for event in tf.compat.v1.train.summary_iterator(str(path))
            for value in event.summary.value}
    return files, tags


@pytest.mark.parametrize("launcher", ["gloo", "horovodrun-mpi"])
def test_two_ranks_train_identically_and_only_rank0_writes(tmp_path, launcher):
    run_dir = tmp_path / "run"
    proc = run_trainer(launcher, 2, *SHORT_RUN, "--output-dir", str(run_dir))
    events = read_metrics(run_dir)
    start, end = events[0], events[-1]
    assert (start["event"], start["world_size"], start["global_batch"]) == ("start", 2, 200)
    assert end["event"] == "end" and end["step"] == 60
    assert len(end["weights_sha256"]) == 2 and len(set(end["weights_sha256"])) == 1
    train = [e for e in events if e["event"] == "train"]
    assert [e["step"] for e in train] == [10, 20, 30, 40, 50, 60]  # one writer: no duplicated lines
    assert train[-1]["loss"] < 0.7 * train[0]["loss"]
    assert all(e["examples_per_sec"] > 0 and e["lr"] > 0 for e in train)
    files, tags = event_tags(run_dir)
    assert len(files) == 1
    assert {"loss", "accuracy", "learning_rate", "test_accuracy", "weights/layer1_weights",
            "gradients/layer1_weights"} <= tags
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    assert saved == ["ckpt-20.index", "ckpt-40.index", "ckpt-60.index"]
    assert (run_dir / "export" / "saved_model.pb").is_file()
    assert proc.stdout.count("step 60/60") + proc.stderr.count("step 60/60") == 1
    assert 0.5 < end["test_accuracy"] <= 1.0


def test_mpirun_rank1_writes_nothing(tmp_path):
    """Each rank runs in its own working directory with a relative --output-dir: only rank 0's gets files."""
    dirs = [tmp_path / "rank0", tmp_path / "rank1"]
    for d in dirs:
        d.mkdir()
    args = [*SHORT_RUN, "--output-dir", "out"]
    rank0, rank1 = (["-wdir", str(d), *trainer_command("python", 1, *args)] for d in dirs)
    command = [*launch_argv("mpirun", 1, *rank0), ":", "-np", "1", *rank1]  # two app contexts, one rank each
    proc = subprocess.run(command, env=launcher_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 rank(s) over mpi" in proc.stdout + proc.stderr
    assert list(dirs[1].iterdir()) == []
    out = dirs[0] / "out"
    assert {p.name for p in out.iterdir()} == {".lock", "checkpoints", "config.toml", "events", "export",
                                               "metrics.jsonl"}
    end = read_metrics(out)[-1]
    assert len(end["weights_sha256"]) == 2 and len(set(end["weights_sha256"])) == 1


def test_two_ranks_equal_one_rank_with_twice_the_batch(tmp_path):
    """np=2 x batch 50 must follow np=1 x batch 100 on the same examples: same losses, same weights."""
    common = ("--steps", "30", "--lr", "0.1", "--log-every", "1", "--checkpoint-every", "30", "--no-shuffle")
    run_trainer("gloo", 2, *common, "--batch-size", "50", "--output-dir", str(tmp_path / "np2"))
    run_trainer("python", 1, *common, "--batch-size", "100", "--output-dir", str(tmp_path / "np1"))
    losses = {name: [e["loss"] for e in read_metrics(tmp_path / name) if e["event"] == "train"]
              for name in ("np1", "np2")}
    assert len(losses["np1"]) == 30
    np.testing.assert_allclose(losses["np2"], losses["np1"], rtol=1e-4)
    assert losses["np1"][-1] < losses["np1"][0]
    np1, np2 = checkpoint_tensors(tmp_path / "np1", 30), checkpoint_tensors(tmp_path / "np2", 30)
    assert np1.keys() == np2.keys() and len(np1) >= 9
    for name in np1:
        np.testing.assert_allclose(np2[name], np1[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_resume_reaches_the_same_weights(tmp_path):
    common = ("--lr", "0.1", "--log-every", "10", "--checkpoint-every", "20")
    run_trainer("gloo", 2, *common, "--steps", "60", "--output-dir", str(tmp_path / "full"))
    run_trainer("gloo", 2, *common, "--steps", "30", "--output-dir", str(tmp_path / "split"))
    run_trainer("gloo", 2, *common, "--steps", "60", "--output-dir", str(tmp_path / "split"), "--resume")
    starts = [e for e in read_metrics(tmp_path / "split") if e["event"] == "start"]
    assert [e["start_step"] for e in starts] == [0, 30]
    full, resumed = checkpoint_tensors(tmp_path / "full", 60), checkpoint_tensors(tmp_path / "split", 60)
    assert full.keys() == resumed.keys()
    for name in full:
        np.testing.assert_array_equal(resumed[name], full[name], err_msg=name)


def test_fp16_allreduce_and_mixed_precision_train(tmp_path):
    """--fp16-allreduce on two ranks keeps the ranks equal; --mixed-precision trains (slowly: float16 on CPU)."""
    run_trainer("gloo", 2, *SHORT_RUN, "--fp16-allreduce", "--output-dir", str(tmp_path / "fp16"))
    train = [e for e in read_metrics(tmp_path / "fp16") if e["event"] == "train"]
    assert train[-1]["loss"] < 0.7 * train[0]["loss"]
    assert len(set(read_metrics(tmp_path / "fp16")[-1]["weights_sha256"])) == 1
    run_trainer("python", 1, "--mixed-precision", "--steps", "20", "--batch-size", "20", "--lr", "0.1",
                "--log-every", "10", "--output-dir", str(tmp_path / "mp"))
    end = read_metrics(tmp_path / "mp")[-1]
    assert end["event"] == "end" and np.isfinite(end["loss"])
    assert checkpoint_tensors(tmp_path / "mp", 20)["model/w1/.ATTRIBUTES/VARIABLE_VALUE"].dtype == np.float32


def test_lenet5_trains_on_two_ranks(tmp_path):
    run_trainer("gloo", 2, "--model", "lenet5", "--steps", "30", "--lr", "0.05", "--log-every", "10",
                "--output-dir", str(tmp_path / "lenet"))
    events = read_metrics(tmp_path / "lenet")
    train = [e for e in events if e["event"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"]
    assert len(set(events[-1]["weights_sha256"])) == 1
    assert "model/conv1_w/.ATTRIBUTES/VARIABLE_VALUE" in checkpoint_tensors(tmp_path / "lenet", 30)


def test_the_main_command_reaches_90_percent_with_the_defaults(tmp_path):
    """The README's main command, `horovodrun -np 2 python -m hvd_mnist`, with no flags: >= 90% test accuracy."""
    run_trainer("horovodrun", 2, "--output-dir", str(tmp_path / "r"))
    events = read_metrics(tmp_path / "r")
    assert events[0]["world_size"] == 2 and events[-1]["step"] == 1000
    assert events[-1]["test_accuracy"] >= 0.90, events[-1]
    # Rank 0's start-up and end phases, in seconds since its process started, in the order they happen.
    phases = events[-1]["phases"]
    assert list(phases) == ["python_and_flags", "tensorflow_imported", "horovod_started", "data_loaded",
                            "run_dir_ready", "restored", "first_call", "trained", "tested", "exported"]
    assert list(phases.values()) == sorted(phases.values()) and events[0]["phases"]["restored"] == phases["restored"]


def test_accumulating_two_batches_equals_two_ranks(tmp_path):
    """np=1 summing K=2 batches of 50 per update must follow np=2 x 50 (K=1): same examples per update, same
    losses and weights; the global batch and the LR decay period are the same too."""
    common = ("--steps", "30", "--lr", "0.1", "--batch-size", "50", "--log-every", "1", "--checkpoint-every", "30",
              "--no-shuffle", "--decay-examples", "3000")
    run_trainer("gloo", 2, *common, "--output-dir", str(tmp_path / "np2"))
    run_trainer("python", 1, *common, "--accumulate", "2", "--output-dir", str(tmp_path / "k2"))
    events = {name: read_metrics(tmp_path / name) for name in ("np2", "k2")}
    assert events["k2"][0]["global_batch"] == events["np2"][0]["global_batch"] == 100
    assert events["k2"][0]["accumulate"] == 2
    train = {name: [e for e in runs if e["event"] == "train"] for name, runs in events.items()}
    np.testing.assert_allclose([e["loss"] for e in train["k2"]], [e["loss"] for e in train["np2"]], rtol=1e-4)
    np.testing.assert_allclose([e["lr"] for e in train["k2"]], [e["lr"] for e in train["np2"]], rtol=1e-6)
    assert train["k2"][-1]["lr"] < train["k2"][0]["lr"]  # the decay period follows the global batch
    np2, k2 = checkpoint_tensors(tmp_path / "np2", 30), checkpoint_tensors(tmp_path / "k2", 30)
    assert np2.keys() == k2.keys() and len(np2) >= 9
    for name in np2:
        np.testing.assert_allclose(k2[name], np2[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_evaluation_while_training_target_and_best_checkpoint(tmp_path):
    """--eval-every on a held-out validation split, --target-accuracy stops early and the run still ends
    normally; --keep-best keeps and exports the best checkpoint; rank 0 alone writes; the plot reads it."""
    run_dir = tmp_path / "run"
    proc = run_trainer("gloo", 2, "--steps", "1000", "--eval-every", "25", "--target-accuracy", "0.9",
                       "--keep-best", "--export", "best", "--output-dir", str(run_dir))
    events = read_metrics(run_dir)
    evals = [e for e in events if e["event"] == "eval"]
    (reached,) = [e for e in events if e["event"] == "target_reached"]
    assert evals and all(e["examples"] == 400 for e in evals)  # a tenth of the 4,000 training digits
    assert reached["accuracy"] >= 0.9 and reached["step"] == evals[-1]["step"] < 1000
    assert len(evals) >= 2 and all(e["accuracy"] < 0.9 for e in evals[:-1])  # stopped at the first that got there
    assert 0 < reached["seconds_since_start"] < TIMEOUT
    end = events[-1]
    assert end["event"] == "end" and end["step"] == reached["step"] and end["test_accuracy"] > 0.8
    assert len(set(end["weights_sha256"])) == 1
    best_step = max(evals, key=lambda e: e["accuracy"])["step"]
    assert tf.train.latest_checkpoint(str(run_dir / "checkpoints" / "best")).endswith(f"best/ckpt-{best_step}")
    assert (run_dir / "export" / "saved_model.pb").is_file()
    assert f"exported the best checkpoint's moving-average model ({run_dir}/checkpoints/best/ckpt-{best_step})" in \
        proc.stdout + proc.stderr
    assert (proc.stdout + proc.stderr).count("reached the target validation accuracy") == 1
    assert {"validation/accuracy", "validation/loss", "test_accuracy"} <= event_tags(run_dir)[1]
    plotted = subprocess.run([str(BIN / "hvd-mnist"), "plot", str(run_dir)], capture_output=True, text=True,
                             timeout=120)
    assert plotted.returncode == 0, plotted.stderr
    assert (run_dir / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_is_written_by_rank0_into_the_run_directory(tmp_path):
    """--horovod-timeline works the same under every launcher (HOROVOD_TIMELINE=DYNAMIC, then
    hvd.start_timeline into the run directory): shown here under mpirun, which has no timeline flag."""
    run_dir = tmp_path / "run"
    run_trainer("mpirun", 2, "--steps", "20", "--log-every", "10", "--horovod-timeline", "--output-dir", str(run_dir))
    text = (run_dir / "timeline.json").read_text()
    assert text.lstrip().startswith("[") and "ALLREDUCE" in text.upper()
