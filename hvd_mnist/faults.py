"""Fault injection for the reliability tests: HVD_MNIST_FAULT=<point>:rank=<r>:step=<n> kills this process.

Points: `step` (after training step n) and `save` (checkpoint n's files written, its index not yet
updated). The kill is a real SIGKILL, so nothing in the process gets to clean up.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "HVD_MNIST_FAULT"


def _parse(spec: str) -> tuple[str, int | None, int]:
    point, *fields = spec.split(":")
    values = dict(field.split("=", 1) for field in fields)
    rank = int(values["rank"]) if "rank" in values else None
    return point, rank, int(values["step"])


def maybe_kill(point: str, rank: int, step: int) -> None:
    """SIGKILL this process if HVD_MNIST_FAULT names this point, rank (or any rank) and step."""
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return
    want_point, want_rank, want_step = _parse(spec)
    if want_point == point and want_step == step and want_rank in (None, rank):
        os.kill(os.getpid(), signal.SIGKILL)
