"""Two "hosts" (network namespaces on a bridge, sshd in each): real launches across them over ssh, of a
model the user wrote in a module outside hvd_mnist (`--model MODULE:FUNCTION`), which the rank on the remote
host must import as the local one does.

Skipped where network namespaces cannot be made (not root, no CAP_NET_ADMIN, no sshd). Everything it starts
is stopped and the namespaces deleted even when a run fails or times out.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from helpers import ROOT, launch_argv, launcher_env, read_metrics, started

from scripts.bench.netns import NetnsCluster

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 300
SHORT_RUN = ("--steps", "40", "--lr", "0.1", "--checkpoint-every", "20", "--log-every", "10")
USER_MODEL = "hostmodels:tiny"  # a module name that no installed package has
USER_MODULE = '''"""A user's model, outside hvd_mnist: 784 pixels to 10 logits (docs/guide.md, "Your own model")."""
import keras


def tiny():
    return keras.Sequential([keras.Input(shape=(784,)), keras.layers.Dense(10)])
'''
# Where the user's module is, and the PYTHONPATH the launch gets (None: none at all). In the launching directory,
# `python -m` puts it first on the path of a rank started there; in a folder named by a relative PYTHONPATH, the
# remote rank needs that variable and the same working directory.
MODULE_PLACES = {"launch-dir": (".", None), "pythonpath": ("models", "models")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """hostA (10.200.0.1) and hostB (10.200.0.2), each with sshd; torn down after the module."""
    with started(NetnsCluster(tmp_path_factory.mktemp("cluster")), "a network-namespace cluster", sshd=True) as nodes:
        yield nodes


def launch_command(launcher: str, hosts: str) -> list[str]:
    """argv, run on hostA, that starts one rank per host with the named launcher."""
    if launcher == "mpirun_cluster.sh":
        return ["bash", str(ROOT / "scripts" / "mpirun_cluster.sh"), "-H", hosts, "--"]
    return launch_argv(launcher, 2, sys.executable, "-m", "hvd_mnist", hosts=hosts,
                       options=["--disable-cache", "--start-timeout", "60"])


@pytest.mark.parametrize("place", list(MODULE_PLACES))
@pytest.mark.parametrize(("launcher", "controller"), [("gloo", "gloo"), ("horovodrun-mpi", "mpi"),
                                                      ("mpirun_cluster.sh", "mpi")])
def test_two_hosts_train_a_users_model_identically(cluster, tmp_path, launcher, controller, place):
    """One rank per host, the remote one started through hostB's sshd, both importing the user's module from
    the launching directory (tmp_path) or from PYTHONPATH: the run ends with equal weights."""
    folder, pythonpath = MODULE_PLACES[place]
    (tmp_path / folder).mkdir(exist_ok=True)
    (tmp_path / folder / f"{USER_MODEL.partition(':')[0]}.py").write_text(USER_MODULE)
    run_dir = tmp_path / "run"
    command = [*launch_command(launcher, cluster.host_spec(1)), "--model", USER_MODEL, *SHORT_RUN,
               "--output-dir", str(run_dir)]
    env = cluster.env({**launcher_env(), "HVD_MNIST_PYTHON": sys.executable})
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    sshd_log = cluster.sshd_log(cluster.hosts[1])
    logged_before = len(sshd_log.read_text())
    proc = subprocess.run(cluster.exec_argv(command), cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert f"2 rank(s) over {controller}" in output
    assert tomllib.loads((run_dir / "config.toml").read_text())["model"] == USER_MODEL
    events = read_metrics(run_dir)
    assert events[0]["event"] == "start" and events[0]["world_size"] == 2
    end = events[-1]
    assert end["event"] == "end" and end["step"] == 40
    assert len(end["weights_sha256"]) == 2 and len(set(end["weights_sha256"])) == 1
    assert "Accepted publickey" in sshd_log.read_text()[logged_before:]
