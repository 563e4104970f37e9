"""The images, built by scripts/build_images.sh and run for real (podman, or docker where its daemon runs).
CPU: help as a non-root user, a 2-rank job inside one container, a host directory as the run directory written
as the host's user, and a two-container cluster over the image's own sshd, launched by horovodrun and by mpirun.
GPU (built here without a GPU): Horovod with NCCL, every library of its TensorFlow op found, no compilers or
CUDA toolkit, and a 2-rank job that falls back to the CPU with identical weights."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import image_build
import pytest
from helpers import launch_argv, metrics_events, read_metrics, wait_for

pytestmark = pytest.mark.slow

BUILD_TIMEOUT = 2400
RUN_TIMEOUT = 300
SHORT_RUN = ("--steps", "100", "--log-every", "50", "--checkpoint-every", "100")
TWO_RANKS = launch_argv("horovodrun", 2, "python", "-m", "hvd_mnist", container=True)  # the image's own horovodrun


class Engine:
    """Runs the engine's CLI and remembers every container and network it made, to remove them all."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tag = f"hvdtest-{uuid.uuid4().hex[:8]}"
        self.containers: list[str] = []
        self.networks: list[str] = []

    def __call__(self, *args: str, check: bool = True, timeout: int = RUN_TIMEOUT) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.name, *args], capture_output=True, text=True, timeout=timeout,
                              env=image_build.engine_env())
        if check and proc.returncode != 0:
            raise AssertionError(f"{self.name} {' '.join(args)} exited {proc.returncode}\n"
                                 f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
        return proc

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """`run --rm ARGS` in a container of its own name, removed afterwards even on a timeout."""
        name = f"{self.tag}-{len(self.containers)}"
        self.containers.append(name)
        return self("run", "--rm", "--name", name, *args, check=check)

    def cleanup(self) -> None:
        for container in self.containers:
            self("rm", "-f", "-t", "0", container, check=False)
        for network in self.networks:
            self("network", "rm", "-f", network, check=False)


@pytest.fixture(scope="module")
def engine_cli() -> Iterator[Engine]:
    name = image_build.engine()
    if name is None:
        pytest.skip("no container engine here (bash scripts/setup_env.sh --dev installs podman on Debian)")
    cli = Engine(name)
    try:
        yield cli
    finally:
        cli.cleanup()


@pytest.fixture(scope="module")
def images(engine_cli: Engine) -> list[str]:
    """hvd-mnist-test:cpu and :gpu, built by the real build script (started in the background when the session
    began)."""
    image_build.start()
    status, printed, log_tail = image_build.started().wait(timeout=BUILD_TIMEOUT)
    assert status == 0, log_tail
    assert printed.split() == [image_build.IMAGE, image_build.GPU_IMAGE]
    return printed.split()


@pytest.fixture(scope="module")
def image(images: list[str]) -> str:
    return image_build.IMAGE


@pytest.fixture(scope="module")
def gpu_image(images: list[str]) -> str:
    return image_build.GPU_IMAGE


def test_image_prints_help_as_a_non_root_user_on_python_313(engine_cli, image):
    proc = engine_cli.run(image)
    assert proc.stdout.startswith("usage: hvd-mnist")
    who = engine_cli.run(image, "sh", "-c", "id -u; python -c 'import sys; print(sys.version_info[:2])'").stdout
    assert who.split("\n")[:2] == ["1000", "(3, 13)"]
    engine_cli.run(image, "sh", "-c", "! command -v gcc && ! command -v g++ && ! command -v cmake")


def test_two_ranks_in_one_container_train_identically(engine_cli, image):
    proc = engine_cli.run(image, *TWO_RANKS, "--steps", "200", "--output-dir", "run")
    output = proc.stdout + proc.stderr
    assert "weights identical on all 2 ranks" in output and "done: step 200" in output
    assert "Traceback" not in output and "oneDNN" not in output


def test_a_host_directory_is_the_run_directory_written_as_the_host_user(engine_cli, image, tmp_path):
    """docs/deployment.md: `--user "$(id -u):$(id -g)" -v "$PWD/runs:/workspace/runs"`; a host user of uid 1234."""
    runs = tmp_path / "runs"
    runs.mkdir()
    os.chown(runs, 1234, 1234)
    engine_cli.run("--user", "1234:1234", "-v", f"{runs}:/workspace/runs", image,
                   *TWO_RANKS, *SHORT_RUN, "--output-dir", "runs/cpu-smoke")
    run_dir = runs / "cpu-smoke"
    assert {p.name for p in run_dir.iterdir()} >= {"config.toml", "metrics.jsonl", "checkpoints", "events", "export"}
    assert (run_dir / "checkpoints" / "ckpt-100.index").is_file()
    assert (run_dir / "export" / "saved_model.pb").is_file()
    assert list((run_dir / "events").glob("events.out.tfevents.*"))
    assert all(path.stat().st_uid == 1234 for path in run_dir.rglob("*"))
    end = read_metrics(run_dir)[-1]
    assert end["step"] == 100 and len(set(end["weights_sha256"])) == 1


@pytest.fixture(scope="module")
def cluster(engine_cli: Engine, image: str, tmp_path_factory) -> dict[str, str]:
    """Two containers, a and b, on a network of their own, each running the image's sshd as its user."""
    keys = tmp_path_factory.mktemp("ssh")
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "3072", "-N", "", "-f", str(keys / "id_rsa")], check=True)
    shutil.copy(keys / "id_rsa.pub", keys / "authorized_keys")
    for path in (keys, *keys.iterdir()):
        os.chown(path, 1000, 1000)
    network = f"{engine_cli.tag}-net"
    engine_cli("network", "create", "--subnet", "10.89.77.0/24", network)
    engine_cli.networks.append(network)
    addresses = {"a": "10.89.77.11", "b": "10.89.77.12"}
    hosts = [f"--add-host={name}:{address}" for name, address in addresses.items()]
    names = {}
    for name, address in addresses.items():
        container = f"{engine_cli.tag}-{name}"
        engine_cli("run", "-d", "--name", container, "--hostname", name, "--network", network, "--ip", address,
                   *hosts, "--shm-size", "256m", "-v", f"{keys}:/home/hvd/.ssh", image,
                   "/usr/sbin/sshd", "-De", "-f", "/home/hvd/.sshd_config")
        engine_cli.containers.append(container)
        names[name] = container
    for container in names.values():  # `run -d` returns before sshd listens; launchers do not wait for it
        wait_for(lambda c=container: engine_cli("exec", c, "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/2222",
                                                 check=False).returncode == 0, 60, f"sshd in {container}")
    return names


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_a_two_container_cluster_trains_with_identical_weights(engine_cli, cluster, launcher):
    """The launching container holds the run directory; the other one runs rank 1 and writes nothing."""
    run_dir = f"/workspace/run-{launcher}"
    options = ["-x", "PATH", "-x", "VIRTUAL_ENV"] if launcher == "mpirun" else []
    command = launch_argv(launcher, 2, "python", "-m", "hvd_mnist", hosts="a:1,b:1", options=options, container=True)
    proc = engine_cli("exec", cluster["a"], *command, *SHORT_RUN, "--output-dir", run_dir)
    output = proc.stdout + proc.stderr
    assert "2 rank(s) over" in output and "weights identical on all 2 ranks" in output, output[-3000:]
    end = metrics_events(engine_cli("exec", cluster["a"], "cat", f"{run_dir}/metrics.jsonl").stdout)[-1]
    assert end["step"] == 100 and len(end["weights_sha256"]) == 2 and len(set(end["weights_sha256"])) == 1
    assert engine_cli("exec", cluster["b"], "test", "-e", run_dir, check=False).returncode != 0


# --- the GPU image, on a machine without a GPU -------------------------------------------------------------------

HOROVOD_TF_LIBRARY = "/opt/venv/lib/python3.13/site-packages/horovod/tensorflow/mpi_lib.cpython-313-x86_64-linux-gnu.so"


def test_gpu_image_has_horovod_with_nccl_mpi_and_gloo(engine_cli, gpu_image):
    check = engine_cli.run(gpu_image, "horovodrun", "--check-build").stdout
    for line in ("[X] TensorFlow", "[X] MPI", "[X] Gloo", "[X] NCCL"):
        assert line in check, check
    nccl = engine_cli.run(gpu_image, "python", "-c", "import horovod.tensorflow as h; print(h.nccl_built())").stdout
    assert int(nccl.split()[-1]) >= 22000  # NCCL 2.22 from Debian 13's libnccl2 (version as 2 22 03 -> 22203)


def test_every_library_of_horovods_tensorflow_op_is_found(engine_cli, gpu_image):
    """ldd, with TensorFlow's folder on the path as importing TensorFlow puts it: NCCL from libnccl2, TensorFlow's
    own libraries, MPI; nothing missing. (The CUDA runtime is linked in statically, Horovod's default.)"""
    tf_dir = "/opt/venv/lib/python3.13/site-packages/tensorflow"
    ldd = engine_cli.run("-e", f"LD_LIBRARY_PATH={tf_dir}", gpu_image, "ldd", HOROVOD_TF_LIBRARY).stdout
    assert "not found" not in ldd, ldd
    for library in ("libnccl.so.2", "libtensorflow_framework.so.2", "libtensorflow_cc.so.2", "libmpi.so"):
        assert f"{library}" in ldd, ldd


def test_gpu_image_runs_as_a_user_without_compilers_or_cuda_toolkit(engine_cli, gpu_image):
    who = engine_cli.run(gpu_image, "sh", "-c", "id -u; env | grep ^NVIDIA_ | sort").stdout.split()
    assert who == ["1000", "NVIDIA_DRIVER_CAPABILITIES=compute,utility", "NVIDIA_VISIBLE_DEVICES=all"]
    engine_cli.run(gpu_image, "sh", "-c", "! command -v gcc && ! command -v g++ && ! command -v nvcc && "
                   "! command -v cmake && ! ls /usr/include/cuda.h /usr/lib/x86_64-linux-gnu/libcuda.so.1")


def test_gpu_image_falls_back_to_the_cpu_with_identical_weights(engine_cli, gpu_image):
    """No GPU is visible here: each rank says it took the CPU, and the run is the CPU image's."""
    proc = engine_cli.run(gpu_image, *TWO_RANKS, "--steps", "100", "--log-every", "50", "--output-dir", "run")
    output = proc.stdout + proc.stderr
    assert re.search(r"2 rank\(s\) over \w+; rank 0 on \S+: CPU \(.*\); rank 1 on \S+: CPU \(", output), output[-3000:]
    assert "weights identical on all 2 ranks" in output and "done: step 100" in output
    assert "Traceback" not in output and "cuInit" not in output  # CUDA's "no driver here" lines are held back
