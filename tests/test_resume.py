"""--resume continues a run as it was: the run directory's config.toml is the starting point, flags given now
change it (named in one line, recorded in metrics.jsonl, the earlier file kept), and the weights are those of
the run that was never interrupted."""

from __future__ import annotations

import tomllib

import pytest
from helpers import end_weights, read_metrics, run_trainer

pytestmark = pytest.mark.slow

# Unlike the defaults wherever a forgotten flag would show: another LR, batch, length and cadence.
RUN = ("--steps", "60", "--lr", "0.05", "--batch-size", "50", "--checkpoint-every", "20", "--log-every", "10",
       "--no-shuffle")


def test_resume_alone_continues_the_run_as_it_was(tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run_trainer("python", 1, *RUN, "--output-dir", str(whole))
    killed = run_trainer("python", 1, *RUN, "--output-dir", str(cut), check=False,
                         extra_env={"HVD_MNIST_FAULT": "step:rank=0:step=45"})  # SIGKILL after step 45; ckpt-40
    assert killed.returncode != 0 and (cut / "checkpoints" / "ckpt-40.index").exists()
    config = (cut / "config.toml").read_text()
    resumed = run_trainer("python", 1, "--output-dir", str(cut), "--resume")
    assert end_weights(cut) == end_weights(whole)
    starts = [e for e in read_metrics(cut) if e["event"] == "start"]
    assert [e["start_step"] for e in starts] == [0, 40] and "config_changes" not in starts[-1]
    assert (cut / "config.toml").read_text() == config and not (cut / "config.1.toml").exists()
    assert "changed" not in resumed.stdout + resumed.stderr


def test_a_flag_given_on_resume_is_named_recorded_and_the_earlier_configuration_kept(tmp_path):
    run_dir = tmp_path / "run"
    run_trainer("python", 1, *RUN, "--output-dir", str(run_dir))
    proc = run_trainer("python", 1, "--output-dir", str(run_dir), "--resume", "--steps", "80", "--lr", "0.01")
    output = proc.stdout + proc.stderr
    assert (f"resuming {run_dir} with --steps 60 -> 80, --lr 0.05 -> 0.01 changed (its earlier configuration is kept "
            "as config.1.toml)") in output
    start = [e for e in read_metrics(run_dir) if e["event"] == "start"][-1]
    assert start["start_step"] == 60 and start["config_changes"] == {"steps": [60, 80], "lr": [0.05, 0.01]}
    now = tomllib.loads((run_dir / "config.toml").read_text())
    before = tomllib.loads((run_dir / "config.1.toml").read_text())
    assert (now["lr"], now["steps"], now["batch-size"]) == (0.01, 80, 50)
    assert (before["lr"], before["steps"], before["batch-size"]) == (0.05, 60, 50)
    assert read_metrics(run_dir)[-1]["step"] == 80
