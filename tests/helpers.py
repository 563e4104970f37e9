"""Helpers shared by the tests (fixtures stay in conftest.py): paths, launching the trainer, starting a cluster,
reading its metrics, waiting, damaging files."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
from slurm_cluster import SlurmCluster

from hvd_mnist.launching import BIN, launch_argv, launcher_env
from scripts.bench.netns import ClusterUnavailable, NetnsCluster

ROOT = Path(__file__).resolve().parents[1]

TIMEOUT = 300  # seconds: the most a launch, or a wait for one to get going, may take before it counts as hung

__all__ = ["BIN", "ROOT", "TIMEOUT", "end_weights", "example_ids", "flip_a_byte", "launch_argv", "launcher_env",
           "metrics_events", "metrics_so_far", "one_rank_under", "rank_pid", "read_metrics", "run_cli", "run_trainer",
           "sshd_privsep_dir", "started", "trainer_command", "wait_for", "wait_for_step"]


# --- launching --------------------------------------------------------------------------------------------------

def trainer_command(launcher: str, np_: int, *args: str) -> list[str]:
    """argv that starts `python -m hvd_mnist ARGS` on np_ ranks with the named launcher."""
    return launch_argv(launcher, np_, sys.executable, "-m", "hvd_mnist", *args)


def one_rank_under(command: list[str], rank: int, setup: str) -> list[str]:
    """`command` (a trainer_command) with the shell lines `setup` (a ulimit, joining a cgroup) run first in rank
    `rank`'s process only: a limit on one rank, as a container or a job step sets one."""
    start = command.index(sys.executable)
    script = f'if [ "${{HOROVOD_RANK:-$OMPI_COMM_WORLD_RANK}}" = {rank} ]; then {setup}; fi; exec "$@"'
    return [*command[:start], "sh", "-c", script, "sh", *command[start:]]


def run_trainer(launcher: str, np_: int, *args: str, cwd: Path | None = None, check: bool = True,
                extra_env: dict[str, str] | None = None,
                one_rank: tuple[int, str] | None = None) -> subprocess.CompletedProcess:
    """Run the trainer for real and return the finished process (output captured); `one_rank`: (rank, shell
    lines) run first in that rank's process only (one_rank_under)."""
    command = trainer_command(launcher, np_, *args)
    if one_rank is not None:
        command = one_rank_under(command, *one_rank)
    proc = subprocess.run(command, cwd=cwd, env={**launcher_env(), **(extra_env or {})},
                          capture_output=True, text=True, timeout=TIMEOUT)
    if check and proc.returncode != 0:
        raise AssertionError(f"trainer exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
                             f"stderr:\n{proc.stderr[-4000:]}")
    return proc


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m hvd_mnist ARGS` in one process, without a launcher, output captured, never checked."""
    return subprocess.run([sys.executable, "-m", "hvd_mnist", *args], capture_output=True, text=True,
                          env=launcher_env(), cwd=cwd, timeout=TIMEOUT)


def sshd_privsep_dir() -> None:
    """sshd -t and sshd -D need /run/sshd, which a fresh machine has only once something makes it."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)


Cluster = TypeVar("Cluster", NetnsCluster, SlurmCluster)


@contextlib.contextmanager
def started(cluster: Cluster, what: str, **start: bool) -> Iterator[Cluster]:
    """`cluster` started, and closed however the test ends; the test is skipped, naming `what`, where this machine
    cannot build it (not root, tools missing)."""
    try:
        try:
            cluster.start(**start)
        except ClusterUnavailable as err:
            pytest.skip(f"cannot build {what} here: {err}")
        yield cluster
    finally:
        cluster.close()


def rank_pid(marker: str, rank: int) -> int | None:
    """PID of the trainer process of `rank` (under horovodrun or mpirun) whose command line contains marker."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ranks = {f"HOROVOD_RANK={rank}".encode(), f"OMPI_COMM_WORLD_RANK={rank}".encode()}
        if b"hvd_mnist" in cmdline and marker.encode() in cmdline and ranks & set(environ):
            return int(entry.name)
    return None


# --- a run's metrics.jsonl --------------------------------------------------------------------------------------

def metrics_events(text: str) -> list[dict]:
    """The events of metrics.jsonl text (one JSON object a line), in order."""
    return [json.loads(line) for line in text.splitlines()]


def read_metrics(run_dir: Path) -> list[dict]:
    """The events of a finished run's metrics.jsonl, in order."""
    return metrics_events((run_dir / "metrics.jsonl").read_text())


def end_weights(run_dir: Path) -> list[str]:
    """Each rank's weights digest in the `end` event of a run that finished."""
    end = read_metrics(run_dir)[-1]
    assert end["event"] == "end", end
    return end["weights_sha256"]


def metrics_so_far(run_dir: Path) -> list[dict]:
    """The complete lines of the metrics.jsonl of a run still writing it; none before the file exists."""
    path = run_dir / "metrics.jsonl"
    text = path.read_text() if path.exists() else ""
    return metrics_events(text[:text.rfind("\n") + 1])  # a line being written has no newline yet


# --- waiting ----------------------------------------------------------------------------------------------------

def wait_for(condition: Callable[[], object], seconds: float, what: str = "the condition") -> None:
    """Poll `condition` until it is true; fail the test, naming `what`, if `seconds` pass first."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {seconds:g} s waiting for {what}"
        time.sleep(0.05)


def wait_for_step(run_dir: Path, step: int, seconds: float = TIMEOUT) -> None:
    """Wait until the run in `run_dir` has logged a training step at or after `step` in its metrics.jsonl."""
    wait_for(lambda: any(e["event"] == "train" and e["step"] >= step for e in metrics_so_far(run_dir)), seconds,
             f"{run_dir} to log step {step}")


# --- data -------------------------------------------------------------------------------------------------------

def flip_a_byte(path: Path) -> Path:
    """Invert the byte in the middle of the file at `path` (damage that keeps its size); returns `path`."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def example_ids(images: np.ndarray) -> list[int]:
    """Recover tiny_split indices from pipeline output (uint8 pixels)."""
    pixels = np.asarray(images)[:, :2].astype(int)
    return list(pixels[:, 0] * 256 + pixels[:, 1])
