"""`hvd-mnist debug RUN_DIR` for real: a running 2-rank job writes every rank's stacks and flight record into its
debug/ folder when asked, goes on, and ends with the weights it would have had unasked (and, a normal run, names
no straggler)."""

from __future__ import annotations

import subprocess

import pytest
from helpers import TIMEOUT, end_weights, launcher_env, metrics_so_far, run_cli, run_trainer, trainer_command, wait_for

pytestmark = pytest.mark.slow
RUN = ("--steps", "3000", "--log-every", "50", "--checkpoint-every", "1000")


def test_a_running_job_dumps_every_rank_when_asked_and_finishes_as_if_unasked(tmp_path):
    run_dir = tmp_path / "asked"
    job = subprocess.Popen(trainer_command("gloo", 2, *RUN, "--output-dir", str(run_dir)), env=launcher_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: job.poll() is not None or any(e["event"] == "train" and e["step"] >= 200
                                                       for e in metrics_so_far(run_dir)), TIMEOUT, "step 200")
        asked = run_cli("debug", str(run_dir))
        assert job.poll() is None, "the job ended before the dump could be asked of it"
        output, _ = job.communicate(timeout=TIMEOUT)
    finally:
        job.kill()
        job.wait()
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.split() == [str(run_dir / "debug" / f"rank-{rank}.txt") for rank in (0, 1)]
    for rank in (0, 1):
        dump = (run_dir / "debug" / f"rank-{rank}.txt").read_text()
        assert dump.startswith(f"hvd_mnist rank {rank} on ") and "asked by hvd-mnist debug at" in dump, dump
        assert "--- thread MainThread (main)" in dump and "--- flight record: the last" in dump, dump
        assert "training  " in dump and " MB allreduced" in dump, dump
    assert job.returncode == 0, output[-3000:]
    assert not (run_dir / "debug" / "request").exists()
    unasked = tmp_path / "unasked"
    plain = run_trainer("gloo", 2, *RUN, "--output-dir", str(unasked))
    assert end_weights(run_dir) == end_weights(unasked)
    assert len(set(end_weights(run_dir))) == 1
    # Two normal runs of 3000 steps on a shared 2-core machine: no rank is named a straggler.
    assert "straggler" not in output + plain.stdout + plain.stderr


def test_debug_without_a_running_job_is_one_line(tmp_path):
    proc = run_cli("debug", str(tmp_path))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (f"hvd-mnist debug: error: no job is running in {tmp_path} (nothing holds its lock); a job "
                           f"that failed or stalled left its dumps in {tmp_path}/debug/\n")
