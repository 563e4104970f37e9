"""The environment every launched rank gets, for the benchmark and the tests alike."""

from __future__ import annotations

import os
import sys
from pathlib import Path

BIN = Path(sys.executable).parent  # the virtualenv's bin: horovodrun, and python for the ranks


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
