"""Fault injection for the reliability tests:
HVD_MNIST_FAULT=<point>:rank=<r>:step=<n>[:signal=STOP|:raise|:sleep=<s>|:collective|:exhaust=<what>]
[:once=<file>], or HVD_MNIST_FAULT=slow[:rank=<r>]:delay=<s>; several faults are separated by commas.

Points: `step` (after training step n) and `save` (checkpoint n's files written, its index not yet
updated). The fault is a real signal to the process itself: SIGKILL by default, so nothing gets to clean
up, or SIGSTOP for a process that hangs without dying; `raise` instead raises an exception hvd_mnist does
not expect, as a bug would; `sleep` blocks the main thread for <s> seconds outside any collective while the
process lives on (its heartbeats too): alive but stuck, as in a deadlock or a read that never returns;
`collective` enters an allreduce that no other rank enters, and waits in it, as code whose ranks take different
branches does; `exhaust` takes `memory` (touched 8 MiB blocks), `threads` or `files` (open descriptors) until
the rank's real limit refuses one (a cgroup, `ulimit -v`, `-n`), as a step that needs more would. With `once`,
the first process to fire creates <file> and later ones (say, a restarted elastic worker) do not fire.
`slow` makes every step of rank <r> <s> seconds longer, inside its compiled step: a straggler.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import numpy as np

ENV_VAR = "HVD_MNIST_FAULT"
EXHAUST_AT_MOST = 100_000  # blocks, threads or files: without a limit, `exhaust` gives up here (the test then fails)
_held: list[object] = []  # what `exhaust` took, kept until the process ends


def _parse(spec: str) -> tuple[str, int | None, int, dict[str, str]]:
    point, *fields = spec.split(":")
    values = dict(field.split("=", 1) if "=" in field else (field, "") for field in fields)  # `raise`: a flag
    rank = int(values["rank"]) if "rank" in values else None
    return point, rank, int(values.get("step", -1)), values


def _planned(point: str, rank: int) -> tuple[int, dict[str, str]] | None:
    """(step, fields) of the fault HVD_MNIST_FAULT plans for this rank at `point` (of several, separated by
    commas, the first that matches), or None."""
    for spec in filter(None, os.environ.get(ENV_VAR, "").split(",")):
        want_point, want_rank, want_step, values = _parse(spec)
        if want_point == point and want_rank in (None, rank):
            return want_step, values
    return None


def planned_step(point: str, rank: int) -> int | None:
    """The step at which HVD_MNIST_FAULT strikes this rank at `point`, or None (the training loop stops there)."""
    planned = _planned(point, rank)
    return planned[0] if planned else None


def planned_delay(rank: int) -> float:
    """Seconds that HVD_MNIST_FAULT=slow adds to each step of this rank (0 if none)."""
    planned = _planned("slow", rank)
    return float(planned[1]["delay"]) if planned else 0.0


def maybe_fault(point: str, rank: int, step: int, lone_collective: Callable[[], None]) -> None:
    """Signal this process (or raise, sleep, or call `lone_collective`) if HVD_MNIST_FAULT names this point, rank
    (or any rank) and step."""
    planned = _planned(point, rank)
    if planned is None or planned[0] != step:
        return
    values = planned[1]
    if "once" in values:
        try:
            os.close(os.open(values["once"], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
    if "raise" in values:
        raise ZeroDivisionError(f"{ENV_VAR}: injected failure at step {step}")
    if "sleep" in values:
        time.sleep(float(values["sleep"]))
        return
    if "collective" in values:
        lone_collective()
        return
    if "exhaust" in values:
        _exhaust(values["exhaust"])
        return
    os.kill(os.getpid(), signal.Signals["SIG" + values.get("signal", "KILL")])


def _exhaust(what: str) -> None:
    """Take `what` (memory, threads, files) until this process's limit refuses, raising the error it gets."""
    release = threading.Event()
    take = {"memory": lambda: time.sleep(0.05) or np.ones(8 * 2**20, np.uint8),  # 160 MiB/s: heartbeats see it
            "threads": lambda: threading.Thread(target=release.wait, daemon=True).start(),
            "files": lambda: open(os.devnull)}[what]  # noqa: SIM115  (held open on purpose)
    for _ in range(EXHAUST_AT_MOST):
        _held.append(take())
