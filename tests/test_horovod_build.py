"""The Horovod that scripts/build_horovod.sh builds behaves as its patches say (patch 5 under both controllers,
patch 6 under Gloo, patches 9 and 10 through horovodrun's choice of a controller)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TIMEOUT, launch_argv, launcher_env

pytestmark = pytest.mark.slow
IDLE_S = 2.0
ALLREDUCES = 200

# Two ranks sit idle for IDLE_S with Horovod's timeline marking every cycle of its background thread, then
# allreduce a tensor that arrives after the idle spell.
IDLE_RANKS = f"""
import sys, time
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
hvd.allreduce(tf.ones(1), name="before")
hvd.start_timeline(sys.argv[1], mark_cycles=True)
time.sleep({IDLE_S})
total = hvd.allreduce(tf.fill([3], float(hvd.rank() + 1)), op=hvd.Sum, name="after")
hvd.stop_timeline()
assert total.numpy().tolist() == [3.0, 3.0, 3.0], total
"""


# Compiled and preloaded into both ranks: counts the calls to epoll_wait, which Gloo's event-loop thread polls with.
EPOLL_COUNTER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <sys/epoll.h>
static int (*real_epoll_wait)(int, struct epoll_event *, int, int);
static atomic_long calls;
int epoll_wait(int fd, struct epoll_event *events, int max, int timeout) {
  if (!real_epoll_wait) real_epoll_wait = dlsym(RTLD_NEXT, "epoll_wait");  /* the same pointer in any thread */
  atomic_fetch_add(&calls, 1);
  return real_epoll_wait(fd, events, max, timeout);
}
long epoll_wait_calls(void) { return atomic_load(&calls); }
"""

# Two ranks, bound to their cores as hvd_mnist binds them (on 2 cores one each, where the polling took the core the
# sending thread needed), average a tensor the size of the MLP's gradient ALLREDUCES times, and report how often
# their event loops polled per allreduce.
GRADIENT_RANKS = f"""
import ctypes
import horovod.tensorflow as hvd
import tensorflow as tf
from hvd_mnist.runtime.world.distribution import bind_to_cores
hvd.init()
bind_to_cores(hvd.local_rank(), hvd.local_size())
calls = ctypes.CDLL(None).epoll_wait_calls
calls.restype = ctypes.c_long
gradient = tf.fill([397510], float(hvd.rank() + 1))
average = tf.function(lambda tensor: hvd.allreduce(tensor, op=hvd.Average, name="gradient"))
average(gradient).numpy()
before = calls()
for _ in range({ALLREDUCES}):
    result = average(gradient)
assert (result.numpy() == 1.5).all(), result
print("polls per allreduce:", (calls() - before) / {ALLREDUCES})
"""


def run_ranks(launcher: str, script: Path, *args: str, env: dict[str, str]) -> str:
    """Run `script` on 2 local ranks under horovodrun with a controller named (gloo, horovodrun-mpi); its output,
    after checking it exited 0."""
    proc = subprocess.run(launch_argv(launcher, 2, sys.executable, str(script), *args), env={**launcher_env(), **env},
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("launcher", ["gloo", "horovodrun-mpi"])
def test_idle_ranks_do_not_meet_every_cycle(tmp_path, launcher):
    """Patch 5: with nothing queued, a rank's background thread waits for its next tensor (10 ms at most)
    instead of coordinating with the other ranks every 1 ms cycle (unpatched: 500-900 cycles per idle second
    here, patched: about 80), and the tensor that ends the wait is still reduced correctly."""
    script, timeline = tmp_path / "idle.py", tmp_path / "timeline.json"
    script.write_text(IDLE_RANKS)
    run_ranks(launcher, script, str(timeline), env={"HOROVOD_TIMELINE": "DYNAMIC"})
    cycles = sum(event["name"] == "CYCLE_START" for event in json.loads(timeline.read_text()) if "name" in event)
    assert 0 < cycles < IDLE_S * 200, f"{cycles} cycles in {IDLE_S} idle seconds"


def test_gloo_event_loop_yields_to_the_sender(tmp_path):
    """Patch 6: Gloo's event-loop thread, finding a connection locked by the thread sending on it, yields the
    core instead of polling again at once. Unpatched, each rank polled 900-3,600 times per allreduce of the
    gradient here, on the core its sender needed; patched, 5-7 times."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "no C compiler (Horovod's build needs one too)"
    counter, script = tmp_path / "epoll_counter.so", tmp_path / "gradient.py"
    (tmp_path / "epoll_counter.c").write_text(EPOLL_COUNTER_C)
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(counter), str(tmp_path / "epoll_counter.c"),
                    "-ldl"], check=True, timeout=TIMEOUT)
    script.write_text(GRADIENT_RANKS)
    output = run_ranks("gloo", script, env={"LD_PRELOAD": str(counter)})
    polls = [float(value) for value in re.findall(r"polls per allreduce: ([0-9.]+)", output)]
    assert len(polls) == 2, output
    assert max(polls) < 50, f"Gloo's event loops polled {polls} times per allreduce"


# What a rank sees of the controller that horovodrun chose for it, in one write: unbuffered, print() writes its
# parts apart, and mpirun's --tag-output then tags each part on its own.
SHOW_CONTROLLER = ("import os, sys; sys.stdout.write('controller: %s\\n' % "
                   "('gloo' if 'HOROVOD_GLOO_RENDEZVOUS_ADDR' in os.environ else 'mpi'))")


def test_launcher_keeps_its_build_probes_answers(tmp_path):
    """Patch 9: horovodrun's "built with MPI?" probe (TensorFlow's library loaded in a forked child, 0.4 s of
    every launch) is answered once per library file and kept in ~/.horovod/built.json; a damaged file is a miss
    and is rewritten, and a kept answer is the one used (a forged "no MPI" makes horovodrun choose Gloo).
    Patch 10: its `mpirun --version` probe, run as a plain subprocess, still finds Open MPI (MPI is chosen)."""
    answers = tmp_path / ".horovod" / "built.json"

    def launch() -> str:
        proc = subprocess.run(launch_argv("horovodrun", 1, sys.executable, "-c", SHOW_CONTROLLER, hosts="localhost:1"),
                              env={**launcher_env(), "HOME": str(tmp_path)},
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return re.findall(r"controller: (\w+)", proc.stdout)[0]

    assert launch() == "mpi"
    kept = json.loads(answers.read_text())
    (key, answer), = kept.items()
    assert key.endswith(": built with MPI") and "mpi_lib" in key and answer is True
    answers.write_text('{"torn')
    assert launch() == "mpi" and json.loads(answers.read_text()) == kept
    answers.write_text(json.dumps({key: False}))
    assert launch() == "gloo"
    assert json.loads(answers.read_text())[key] is False
