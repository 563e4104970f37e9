"""Shared test helpers: small synthetic splits and real launchers (python, horovodrun, mpirun)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import image_build
import numpy as np
import pytest
from helpers import launcher_env

BIN = Path(sys.executable).parent
TIMEOUT = 300


@pytest.hookimpl(trylast=True)  # after -m/-k have deselected: a run without the container tests builds nothing
def pytest_collection_modifyitems(session, config, items) -> None:
    """test_containers.py runs last, and the image it needs starts building now, in the background."""
    containers = [item for item in items if item.path.name == "test_containers.py"]
    if containers:
        items[:] = [item for item in items if item.path.name != "test_containers.py"] + containers
        image_build.start()


def pytest_sessionfinish(session, exitstatus) -> None:
    if (build := image_build.started()) is not None:
        build.stop()


def trainer_command(launcher: str, np_: int, *args: str) -> list[str]:
    """argv that starts `python -m hvd_mnist ARGS` on np_ ranks with the named launcher."""
    module = [sys.executable, "-m", "hvd_mnist", *args]
    if launcher == "python":
        assert np_ == 1
        return module
    if launcher == "horovodrun":  # the README's command: MPI where Open MPI is installed
        return [str(BIN / "horovodrun"), "-np", str(np_), *module]
    if launcher == "gloo":
        return [str(BIN / "horovodrun"), "--gloo", "-np", str(np_), "-H", f"localhost:{np_}", *module]
    if launcher == "horovodrun-mpi":
        return [str(BIN / "horovodrun"), "--mpi", "-np", str(np_), "-H", f"localhost:{np_}", *module]
    if launcher == "mpirun":
        return ["mpirun", "--allow-run-as-root", "-np", str(np_), "--bind-to", "none", *module]
    raise ValueError(launcher)


def run_trainer(launcher: str, np_: int, *args: str, cwd: Path | None = None, check: bool = True,
                extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the trainer for real and return the finished process (output captured)."""
    proc = subprocess.run(trainer_command(launcher, np_, *args), cwd=cwd, env={**launcher_env(), **(extra_env or {})},
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


def read_metrics(run_dir: Path) -> list[dict]:
    """The events of a run's metrics.jsonl, in order."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def tiny_split():
    """120 distinct synthetic examples whose first two pixels encode their index."""
    from hvd_mnist.data.sources import Split

    count = 120
    images = np.random.default_rng(1).integers(0, 256, size=(count, 784), dtype=np.uint8)
    images[:, 0], images[:, 1] = np.arange(count) // 256, np.arange(count) % 256
    return Split(images, np.arange(count, dtype=np.int64) % 10)


def example_ids(images: np.ndarray) -> list[int]:
    """Recover tiny_split indices from pipeline output (uint8 pixels)."""
    pixels = np.asarray(images)[:, :2].astype(int)
    return list(pixels[:, 0] * 256 + pixels[:, 1])
