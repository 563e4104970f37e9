"""The image builds (CPU and GPU flavors) for test_containers.py, started in the background at the lowest CPU
priority as soon as the session has collected those tests (conftest runs them last), so that the builds'
downloads and compiles overlap the rest of the suite instead of adding to it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from helpers import ROOT

PODMAN_CONF = ROOT / "docker" / "podman-containers.conf"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TAG = "hvd-mnist-test"
IMAGE = f"{TAG}:cpu"
GPU_IMAGE = f"{TAG}:gpu"


def engine() -> str | None:
    """docker where its daemon answers, else podman, else None (no engine can run here)."""
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return "docker"
    return "podman" if shutil.which("podman") else None


def engine_env() -> dict[str, str]:
    """Podman as root on this machine kind needs runc and lower ulimits (docker/podman-containers.conf)."""
    env = dict(os.environ)
    if not Path("/etc/containers/containers.conf").exists():
        env.setdefault("CONTAINERS_CONF", str(PODMAN_CONF))
    return env


class ImageBuild:
    """scripts/build_images.sh running in the background; `wait` returns its exit status and output."""

    def __init__(self, engine_name: str) -> None:
        command = ["nice", "-n", "19", "ionice", "-c", "3", "bash", str(ROOT / "scripts" / "build_images.sh"),
                   "--engine", engine_name, "--tag", TAG, "--gpu"]
        if HOST_CA_BUNDLE.exists():  # test builds only: pip behind this machine's TLS-inspecting proxy
            command += ["--ca-bundle", str(HOST_CA_BUNDLE)]
        handle, path = tempfile.mkstemp(prefix="hvd-mnist-image-build-", suffix=".log")
        os.close(handle)
        self.log = Path(path)
        with self.log.open("w") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=engine_env(),
                                            start_new_session=True)  # its own group: stop() ends all of it

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """(exit status, the image names it printed, the tail of its log)."""
        stdout, _ = self.process.communicate(timeout=timeout)
        return self.process.returncode, stdout, self.log.read_text(errors="replace")[-5000:]

    def stop(self) -> None:
        """End the build script and everything it started (the engine's build, its compilers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.log.unlink(missing_ok=True)


_build: ImageBuild | None = None


def start() -> None:
    """Start the build once (where an engine exists; the tests skip, with the reason, where none does)."""
    global _build
    name = engine()
    if _build is None and name is not None:
        _build = ImageBuild(name)


def started() -> ImageBuild | None:
    return _build
