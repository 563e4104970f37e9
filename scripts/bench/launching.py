"""How the benchmark launches its jobs: under a time limit, in a loopback-only network namespace where it can,
leaving no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hvd_mnist.launching import launch_argv, launcher_env

ROOT = Path(__file__).resolve().parents[2]  # the repository: jobs run from here, so `-m hvd_mnist` imports
PEERS = ROOT / "scripts" / "peers"
NETNS_PREFIX = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']


class BenchmarkError(RuntimeError):
    """A job failed, ran past its time limit, or left no figures to read."""


def launcher_prefix(launcher: str, np_: int) -> list[str]:
    """argv that starts np_ copies of what follows it: one-core and local are the benchmark's own, the rest
    (python, gloo, mpirun) hvd_mnist.launching's."""
    if launcher == "one-core":
        return ["taskset", "--cpu-list", "0"]
    if launcher == "local":
        return [sys.executable, str(PEERS / "local_workers.py"), "--np", str(np_), "--"]
    return launch_argv(launcher, np_)


def network_namespace_works() -> bool:
    """True when `unshare --net` can give jobs a loopback-only network here (root or user namespaces)."""
    try:
        probe = subprocess.run([*NETNS_PREFIX, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def gpu_present() -> bool:
    """True when TensorFlow in this environment sees a GPU (asked in a short-lived child process)."""
    probe = [sys.executable, "-c", "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"]
    try:
        found = subprocess.run(probe, capture_output=True, text=True, timeout=120, env=launcher_env(gpu=True))
    except subprocess.TimeoutExpired:
        return False
    last_line = found.stdout.strip().splitlines()[-1:] or ["0"]
    return found.returncode == 0 and last_line[0].isdigit() and int(last_line[0]) > 0


def launch(launcher: str, np_: int, argv: list[str], run_dir: Path, *, timeout: int, isolate: bool = False,
           gpu: bool = False, env: dict[str, str] | None = None) -> float:
    """Run `python ARGV` on np_ ranks to completion within `timeout` seconds, with `env` added to the
    environment, its output in run_dir/log.txt, in a loopback-only network namespace when `isolate` and there is
    more than one rank; its wall seconds."""
    command = [*launcher_prefix(launcher, np_), sys.executable, *argv]
    if isolate and np_ > 1:
        command = [*NETNS_PREFIX, *command]
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "log.txt"
    start = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env={**launcher_env(gpu, gloo_loopback=True), **(env or {})},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            kill_group(proc)
    if code is None:
        raise BenchmarkError(f"ran past {timeout}s (log: {log_path})")
    if code != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
        raise BenchmarkError(f"exit {code}: {tail[0] if tail else ''} (log: {log_path})")
    return time.perf_counter() - start


def kill_group(proc: subprocess.Popen) -> None:
    """End the job's process group (the launcher's children included), then reap the launcher."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
