"""Real limits on one rank of a 2-rank job (a memory cgroup, `ulimit -v`, `ulimit -n`): every rank ends with one
line naming the rank and what ran out, or the limit it died near; a limit too small is refused before the run
directory is made."""

from __future__ import annotations

import re
import subprocess

import pytest
from helpers import run_trainer
from test_reliability import RUN, error_lines

pytestmark = pytest.mark.slow

BIG_STEP = ("--dataset", "fashion_mnist", "--batch-size", "20000")  # about 411 MiB of activations a step
# Start-up (TensorFlow, Horovod, the data) takes about 1.8 GiB of address space here; a batch of 20000 then
# needs more than 2.1 GiB in its first step, and 2.9 GiB leaves room for start-up and a few steps.
STEP_FAILS_KIB, ROOM_KIB = 2_200_000, 3_000_000
START_FAILS_KIB = 1_000_000  # too little to load Horovod's library


def exhausting(what: str) -> dict[str, str]:
    """Rank 1 takes `what` after step 30 until its limit refuses (HVD_MNIST_FAULT's `exhaust`)."""
    return {"HVD_MNIST_FAULT": f"step:rank=1:step=30:exhaust={what}"}


def assert_named_on_every_rank(proc: subprocess.CompletedProcess, cause: str) -> list[str]:
    """The failing rank's line is `cause`, the other's repeats it; nothing says 'unexpected', stuck or a plain
    death; returns the lines."""
    lines = error_lines(proc)
    assert proc.returncode != 0
    assert any(f"hvd-mnist: error: {cause}" in line for line in lines), lines
    assert any(f": {cause}" in line and "hvd-mnist: error: rank 1" not in line for line in lines), lines
    text = proc.stdout + proc.stderr
    for wrong in ("unexpected", "alive but stuck", "died (their connection closed)", "Traceback"):
        assert wrong not in text, (wrong, lines)
    return lines


@pytest.mark.parametrize("launcher", ["gloo", "mpirun"])
def test_a_step_that_cannot_allocate_names_the_rank_and_memory(tmp_path, launcher):
    """TensorFlow's ResourceExhaustedError (a GPU's out of memory; here a CPU allocation refused by ulimit -v)."""
    run_dir = tmp_path / "run"
    proc = run_trainer(launcher, 2, *RUN, *BIG_STEP, "--steps", "40", "--output-dir", str(run_dir), check=False,
                       one_rank=(1, f"ulimit -v {STEP_FAILS_KIB}"))
    lines = assert_named_on_every_rank(proc, "rank 1 ran out of memory at ")
    assert any("(RLIMIT_AS): OOM when allocating tensor" in line for line in lines), lines
    assert (run_dir / "metrics.jsonl").is_file()


@pytest.mark.parametrize(("what", "limit", "says"), [
    ("memory", f"ulimit -v {ROOM_KIB}", "rank 1 ran out of memory at "),
    ("threads", f"ulimit -v {ROOM_KIB}", "rank 1 ran out of threads: can't start new thread"),
    ("files", "ulimit -n 64", "rank 1 ran out of open files: [Errno 24] Too many open files"),
])
def test_a_rank_that_runs_out_mid_run_says_what_on_every_rank(tmp_path, what, limit, says):
    run_dir = tmp_path / "run"
    proc = run_trainer("gloo", 2, *RUN, "--steps", "60", "--output-dir", str(run_dir), check=False,
                       extra_env=exhausting(what), one_rank=(1, limit))
    assert_named_on_every_rank(proc, says)
    assert (run_dir / "checkpoints" / "ckpt-20.index").is_file()  # the checkpoint before it is whole


@pytest.mark.parametrize("launcher", ["gloo", "mpirun"])
def test_a_rank_without_room_to_start_says_so(tmp_path, launcher):
    """`ulimit -v` during start-up: too little address space to load TensorFlow's and Horovod's libraries is
    running out of memory, not a Horovod built against another TensorFlow (the loader's 'failed to map segment')."""
    proc = run_trainer(launcher, 2, *RUN, "--steps", "20", "--output-dir", str(tmp_path / "run"), check=False,
                       one_rank=(1, f"ulimit -v {START_FAILS_KIB}"))
    lines = error_lines(proc)
    assert proc.returncode != 0
    ran_out = re.compile(r"hvd-mnist: error: rank 1 ran out of memory at \d+ of 977 MiB \(RLIMIT_AS\): ")
    assert any(ran_out.search(line) for line in lines), (lines, proc.stderr[-3000:])
    for wrong in ("unexpected", "cannot load against", "Traceback", "--batch-size"):
        assert wrong not in proc.stdout + proc.stderr, (wrong, lines)


def test_a_rank_killed_in_its_memory_cgroup_is_named_with_its_last_memory(tmp_path, memory_cgroup):
    """Gloo: rank 0 outlives rank 1 and names it. mpirun ends every rank itself, at once, when one is killed
    (`exited on signal 9 (Killed)`, faults.md)."""
    group = memory_cgroup(1200 * 2**20)
    proc = run_trainer("gloo", 2, *RUN, "--steps", "60", "--output-dir", str(tmp_path / "run"), check=False,
                       extra_env=exhausting("memory"), one_rank=(1, f"echo $$ > {group}/cgroup.procs"))
    lines = error_lines(proc)
    assert proc.returncode != 0
    died = re.compile(r"rank 1 died at \d+ of 1200 MiB \(cgroup v[12] limit\): most likely killed for memory")
    assert any(died.search(line) for line in lines), (lines, proc.stderr[-3000:])
    assert "background loop" not in proc.stdout + proc.stderr  # Horovod's line: in rank 0's dump only
    assert "Horovod background loop uncaught exception" in (tmp_path / "run" / "debug" / "rank-0.txt").read_text()


def test_a_cgroup_limit_too_small_is_refused_on_every_rank_before_the_run_directory(tmp_path, memory_cgroup):
    run_dir = tmp_path / "run"
    proc = run_trainer("gloo", 2, *RUN, *BIG_STEP, "--output-dir", str(run_dir), check=False,
                       one_rank=(1, f"echo $$ > {memory_cgroup(420 * 2**20)}/cgroup.procs"))
    refusal = re.compile(r"hvd-mnist: error: --batch-size 20000 needs about 411 MiB for one step's activations; "
                         r"rank 1 has \d+ MiB left, at \d+ of 420 MiB \(cgroup v[12] limit\)$")
    lines = [line for line in error_lines(proc) if refusal.search(line)]
    assert len(lines) == 2, error_lines(proc)
    assert not run_dir.exists()
