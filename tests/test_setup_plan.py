"""scripts/setup_env.sh's plan, read from its --dry-run: the CPU set-up plans tensorflow-cpu, and --gpu plans the
GPU image's route (tensorflow[and-cuda], Horovod built with the Dockerfile's NCCL variables, a wheel cache of its
own). A --gpu whose machine lacks CUDA 12's nvcc, NCCL or a host compiler both accept stops in one line before it
installs or creates anything; its dry run says so and exits 0. The CUDA toolchain is made up here (fake nvcc,
nccl.h, g++), so the outcome never depends on what this machine has."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

SCRIPT = ROOT / "scripts" / "setup_env.sh"
PLAN_LINE = re.compile(r"^\[setup\]   ([a-z -]+): (.*)$")
CPU_FLAGS = {"HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITH_MPI": "1",
             "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1"}


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text + "\n")
    path.chmod(0o755)
    return path


def toolchain(tmp_path: Path, cuda: str = "12.4", gcc: str = "12") -> dict[str, str]:
    """The variables that point the set-up at a made-up CUDA `cuda` nvcc, NCCL and a GCC `gcc` g++."""
    cuda_home = tmp_path / "cuda"
    executable(cuda_home / "bin" / "nvcc", f'echo "Cuda compilation tools, release {cuda}, V{cuda}.131"')
    nccl = tmp_path / "nccl"
    for part in ("include/nccl.h", "lib/libnccl.so"):
        (nccl / part).parent.mkdir(parents=True, exist_ok=True)
        (nccl / part).touch()
    cxx = executable(tmp_path / "compilers" / f"g++-{gcc}", f"echo {gcc}.2.0")
    return {"HOROVOD_CUDA_HOME": str(cuda_home), "HOROVOD_NCCL_HOME": str(nccl), "CXX": str(cxx)}


def setup_env(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """scripts/setup_env.sh ARGS with its virtualenv and wheel cache in tmp_path, an apt-get that leaves a mark
    instead of installing, and a pip that finds no index (a set-up that went past its pre-flight fails fast)."""
    executable(tmp_path / "bin" / "apt-get", f'touch "{tmp_path / "apt-get-ran"}"; exit 1')
    mine = ("HOROVOD_CUDA_HOME", "HOROVOD_NCCL_HOME", "CXX", "PYTHON")
    inherited = {k: v for k, v in os.environ.items() if k not in mine and not k.startswith("HVD_MNIST")}
    environ = {**inherited, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "PYTHON": sys.executable,
               "PIP_NO_INDEX": "1", "HVD_MNIST_VENV": str(tmp_path / "venv"),
               "HVD_MNIST_WHEEL_DIR": str(tmp_path / "wheels"), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], env=environ, capture_output=True, text=True, timeout=120)


def plan(tmp_path: Path, *args: str, **env: str) -> dict[str, str | list[str]]:
    """The dry run's plan: each `  key: value` line, `found` lines as a list; nothing made, exit 0."""
    proc = setup_env(tmp_path, *args, "--dry-run", **env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("[setup] dry run of "), proc.stdout
    found: dict[str, str | list[str]] = {"found": []}
    for line in proc.stdout.splitlines()[1:]:
        key, value = PLAN_LINE.match(line).groups()
        if key == "found":
            found["found"].append(value)
        else:
            found[key] = value
    assert_nothing_made(tmp_path)
    return found


def assert_nothing_made(tmp_path: Path) -> None:
    assert not (tmp_path / "venv").exists()
    assert not (tmp_path / "wheels").exists()
    assert not (tmp_path / "apt-get-ran").exists()


def build_variables(found: dict) -> dict[str, str]:
    return dict(flag.split("=", 1) for flag in found["horovod build"].split())


def dockerfile_gpu_build_variables() -> dict[str, str]:
    """Every HOROVOD_* variable with a value that docker/Dockerfile builds the gpu flavor with."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    variables = dict(re.findall(r"\b(HOROVOD_[A-Z_]+)=(\S+?)\s", text))
    assert variables["HOROVOD_GPU_OPERATIONS"] == "NCCL", variables  # the Dockerfile as this test reads it
    return variables


@pytest.mark.parametrize("mode", ["", "--dev"])
def test_the_cpu_plans_install_tensorflow_cpu_and_build_horovod_without_nccl(tmp_path, mode):
    found = plan(tmp_path, *([mode] if mode else []))
    pip = found["pip packages"].split()
    assert {"tensorflow-cpu==2.21.0", "tensorboard==2.21.0", "mpi4py==4.1.2", "horovod==0.28.1",
            "mlxtend==0.25.0"} <= set(pip), pip
    assert not [p for p in pip if p.startswith("tensorflow[")], pip
    assert pip[-1] == ("hvd_mnist[cpu,dev]" if mode else "hvd_mnist[cpu]")
    assert ("torch==2.13.0" in pip) == (mode == "--dev")
    assert build_variables(found) == CPU_FLAGS
    assert {"libopenmpi-dev", "openmpi-bin"} <= set(found["debian packages"].split())
    assert "debian packages required first" not in found
    assert found["wheel cache"].startswith(f"{tmp_path / 'wheels'}/horovod-0.28.1-tf2.21.0-py3.")
    assert found["pre-flight"] == "ok"
    assert found["found"] == []


def test_the_gpu_plan_is_the_gpu_images_route(tmp_path):
    tools = toolchain(tmp_path)
    found = plan(tmp_path, "--gpu", **tools)
    pip = found["pip packages"].split()
    assert "tensorflow[and-cuda]==2.21.0" in pip and pip[-1] == "hvd_mnist[gpu]", pip
    assert not [p for p in pip if p.startswith("tensorflow-cpu")], pip
    assert {"tensorboard==2.21.0", "mpi4py==4.1.2", "horovod==0.28.1"} <= set(pip), pip
    variables = build_variables(found)
    assert variables == {**CPU_FLAGS, "HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_NCCL_LINK": "SHARED",
                         "HOROVOD_BUILD_CUDA_CC_LIST": "70,75,80,86,89,90",
                         "HOROVOD_CUDA_HOME": tools["HOROVOD_CUDA_HOME"],
                         "HOROVOD_NCCL_HOME": tools["HOROVOD_NCCL_HOME"]}
    image = dockerfile_gpu_build_variables()
    assert {k: v for k, v in image.items() if k != "HOROVOD_CUDA_HOME"} == {
        k: v for k, v in variables.items() if k in image and k != "HOROVOD_CUDA_HOME"}
    assert set(image) <= set(variables), set(image) - set(variables)
    assert {"nvidia-cuda-toolkit", "libnccl-dev", "g++-12"} <= set(found["debian packages required first"].split())
    assert found["pre-flight"] == "ok"
    assert f"nvcc: {tools['HOROVOD_CUDA_HOME']}/bin/nvcc, CUDA 12.4 (host compilers up to GCC 13)" in found["found"][0]
    assert found["found"][1] == f"NCCL: {tmp_path}/nccl/include/nccl.h, {tmp_path}/nccl/lib/libnccl.so"
    # A wheel cache of its own: a CPU Horovod is never installed for --gpu, nor the reverse.
    gpu_cache = found["wheel cache"].split(" (")[0]
    cpu_cache = plan(tmp_path, **tools)["wheel cache"].split(" (")[0]
    assert re.fullmatch(rf"{tmp_path}/wheels/horovod-0\.28\.1-tf2\.21\.0-nccl-py3\.\d+-[0-9a-f]{{16}}", gpu_cache)
    assert re.fullmatch(rf"{tmp_path}/wheels/horovod-0\.28\.1-tf2\.21\.0-py3\.\d+-[0-9a-f]{{16}}", cpu_cache)
    assert cpu_cache.rsplit("-", 1)[1] != gpu_cache.rsplit("-", 1)[1]  # the key, which the build variables change


def test_the_gpu_dry_run_without_nvcc_says_it_would_stop_and_exits_0(tmp_path):
    found = plan(tmp_path, "--gpu", **{**toolchain(tmp_path), "HOROVOD_CUDA_HOME": str(tmp_path / "no-cuda")})
    assert found["pre-flight"].startswith("would fail: --gpu stops before installing anything; missing: nvcc"), found
    assert "nvidia-cuda-toolkit" in found["pre-flight"]
    assert f"nvcc: not found in HOROVOD_CUDA_HOME/bin ({tmp_path}/no-cuda/bin)" in found["found"]
    assert "tensorflow[and-cuda]==2.21.0" in found["pip packages"].split()


BROKEN_TOOLCHAINS = {  # what is broken -> what the one line must say (its first words: that part's start)
    "no-nvcc": ({"HOROVOD_CUDA_HOME": "no-cuda"}, ["nvcc, CUDA 12's compiler, not found", "nvidia-cuda-toolkit"]),
    "cuda-13": ({"cuda": "13.0"}, ["nvcc from CUDA 12", "is CUDA 13.0", "nvidia-cuda-toolkit"]),
    "no-nccl": ({"HOROVOD_NCCL_HOME": "no-nccl"}, ["NCCL's nccl.h and libnccl.so", "libnccl-dev"]),
    "gcc-14": ({"gcc": "14"}, ["a host compiler of GCC 12 or older", "is GCC 14", "g++-12"]),
}


@pytest.mark.parametrize(("broken", "named"), BROKEN_TOOLCHAINS.values(), ids=BROKEN_TOOLCHAINS.keys())
def test_gpu_on_a_machine_without_its_toolchain_stops_in_one_line_having_made_nothing(tmp_path, broken, named):
    tools = toolchain(tmp_path, cuda=broken.get("cuda", "12.4"), gcc=broken.get("gcc", "12"))
    tools.update({k: str(tmp_path / v) for k, v in broken.items() if k.startswith("HOROVOD_")})
    proc = setup_env(tmp_path, "--gpu", **tools)
    assert proc.returncode == 1, proc
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("[setup] error: --gpu stops before installing anything; missing: ")
    for words in named:
        assert words in lines[0], lines[0]
    others = [other[0] for _, other in BROKEN_TOOLCHAINS.values() if other is not named]
    assert not [other for other in others if other in lines[0]], lines[0]  # only what is missing
    assert_nothing_made(tmp_path)


def test_gpu_refuses_a_virtualenv_that_holds_tensorflow_cpu(tmp_path):
    """A CPU set-up's virtualenv: its Python sees a tensorflow-cpu (made up here) and answers `-c` only, so that
    nothing could ever be installed through it."""
    site = tmp_path / "site" / "tensorflow_cpu-2.21.0.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow-cpu\nVersion: 2.21.0\n")
    executable(tmp_path / "cpu-venv" / "bin" / "python",
               f'case "$1" in -c) PYTHONPATH="{site.parent}" exec "{sys.executable}" -S "$@" ;; esac\n'
               'echo "this stand-in runs -c only: $*" >&2; exit 97')
    proc = setup_env(tmp_path, "--gpu", **toolchain(tmp_path), HVD_MNIST_VENV=str(tmp_path / "cpu-venv"))
    assert proc.returncode == 1, proc
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("[setup] error: --gpu stops before installing anything; missing: a virtualenv "
                               f"without tensorflow-cpu ({tmp_path}/cpu-venv holds it"), lines[0]
    assert "HVD_MNIST_VENV" in lines[0]
    assert [p.name for p in (tmp_path / "cpu-venv").rglob("*")] == ["bin", "python"]
    assert not (tmp_path / "apt-get-ran").exists()


def test_the_usage_line_names_every_mode_and_a_wrong_flag_is_refused(tmp_path):
    shown = setup_env(tmp_path, "--help")
    assert shown.returncode == 0
    assert shown.stdout.splitlines()[0] == "usage: bash scripts/setup_env.sh [--dev | --gpu] [--dry-run]"
    for flag in ("--dev", "--gpu", "--dry-run", "HOROVOD_CUDA_HOME"):
        assert flag in shown.stdout
    for wrong in (["--cuda"], ["--dev", "--gpu"]):
        proc = setup_env(tmp_path, *wrong)
        assert proc.returncode == 2 and proc.stderr.startswith("usage: "), (wrong, proc)
    assert_nothing_made(tmp_path)
