"""CPU binding: each local rank gets its own share of the cores, unless the launcher already bound it."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or len(os.sched_getaffinity(0)) < os.cpu_count(),
                                reason="needs at least 2 cores and an unrestricted CPU mask")

CHILD = """
import os, sys, threading
from hvd_mnist.runtime.world.distribution import bind_to_cores
if sys.argv[3] == "prebound":
    os.sched_setaffinity(0, {0})
idle = threading.Event()
early = threading.Thread(target=idle.wait)  # a thread started before binding must move too
early.start()
share = bind_to_cores(int(sys.argv[1]), int(sys.argv[2]))
late = threading.Thread(target=idle.wait)
late.start()
masks = {tuple(sorted(os.sched_getaffinity(int(tid)))) for tid in os.listdir("/proc/self/task")}
idle.set()
print(share, sorted(masks))
"""


def _child(local_rank: int, local_size: int, mode: str = "free") -> str:
    done = subprocess.run([sys.executable, "-c", CHILD, str(local_rank), str(local_size), mode],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_each_local_rank_gets_a_disjoint_share_on_every_thread():
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    assert _child(0, 2) == f"{cores[:half]} [{tuple(cores[:half])}]"
    assert _child(1, 2) == f"{cores[half:2 * half]} [{tuple(cores[half:2 * half])}]"


def test_a_single_rank_keeps_every_core():
    cores = sorted(os.sched_getaffinity(0))
    assert _child(0, 1) == f"{cores} [{tuple(cores)}]"


def test_a_binding_made_by_the_launcher_is_kept():
    assert _child(1, 2, "prebound").startswith("None")
