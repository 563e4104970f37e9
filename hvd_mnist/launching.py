"""The argv that starts N ranks of a command under a launcher, and the environment they get here: one home for the
tests, the benchmark and the containers' commands. The standard library only, so importing it costs nothing."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

BIN = Path(sys.executable).parent  # the virtualenv's bin: horovodrun, and python for the ranks
HOROVODRUN = BIN / "horovodrun"
CONTROLLERS = {"horovodrun": [], "gloo": ["--gloo"], "horovodrun-mpi": ["--mpi"]}  # horovodrun's, by launcher


def launch_argv(launcher: str, np_: int, *command: str, hosts: str | None = None, options: Sequence[str] = (),
                container: bool = False) -> list[str]:
    """argv that runs `command` on np_ ranks: `python` (one process, no launcher), `horovodrun` (Horovod picks its
    controller), `gloo` or `horovodrun-mpi` (horovodrun --gloo / --mpi, np_ slots on localhost unless `hosts`),
    `mpirun`. `hosts`: the `-H host:slots,...` list; `options`: the launcher's own further options; `container`:
    the launcher is an image's own (on its PATH, run as its user), not this virtualenv's run as root."""
    if launcher == "python":
        assert np_ == 1
        return list(command)
    if launcher == "mpirun":
        # Here as root, and unbound: Open MPI binds each of 2 ranks to a core of its own by default, which leaves
        # TensorFlow's threads one core each.
        here, unbound = ((), ()) if container else (("--allow-run-as-root",), ("--bind-to", "none"))
        return ["mpirun", *here, "-np", str(np_), *host_option(hosts), *unbound, *options, *command]
    controller = CONTROLLERS[launcher]
    hosts = hosts or (f"localhost:{np_}" if controller else None)
    program = "horovodrun" if container else str(HOROVODRUN)
    return [program, *controller, "-np", str(np_), *host_option(hosts), *options, *command]


def host_option(hosts: str | None) -> list[str]:
    """`-H HOSTS` (host:slots,...) where hosts are named; nothing otherwise."""
    return ["-H", hosts] if hosts else []


def launcher_env(gpu: bool = False, gloo_loopback: bool = False) -> dict[str, str]:
    """Quiet TensorFlow, no GPU probing (unless `gpu`), root allowed in mpirun, this virtualenv first on PATH.

    `gloo_loopback` keeps Gloo on the loopback interface (the benchmark's single-machine jobs); the multi-host
    tests need Gloo to pick the interface between their hosts, so it is off by default.
    """
    env = dict(os.environ)
    env.update(TF_CPP_MIN_LOG_LEVEL="2", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    if gloo_loopback:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env
