"""Which rank is slow: each rank's compute and allreduce wait per step, and the rank that keeps the others
waiting named while the job runs.

In a synchronous step every rank takes as long as the slowest: the fast ones wait for it in the allreduce. So
a rank's own compute (its step's time less that wait) tells the straggler apart, where the step time cannot.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

WINDOW = 5  # paces in a row that a straggler must be slow in
PACE_STEPS = 100  # each pace spans at least this many steps, however often progress is reported
RATIO = 1.5  # its compute against the median of the others', in each of them
MARGIN_S = 0.5e-3  # and at least this much more per step (microsecond steps are all noise)


class Pace:
    """This rank's compute and allreduce wait per step over the last PACE_STEPS steps or more (the first, tracing
    call left out)."""

    def __init__(self) -> None:
        self._steps, self._compute, self._wait = 0, 0.0, 0.0
        self._started = 0.0

    def start(self) -> None:
        self._started = time.perf_counter()

    def add(self, steps: int, allreduce_seconds: float) -> None:
        """A call of `steps` steps ended now, `allreduce_seconds` of it in the allreduce."""
        took = time.perf_counter() - self._started
        self._steps += steps
        self._compute += max(took - allreduce_seconds, 0.0)
        self._wait += allreduce_seconds

    def per_step(self) -> tuple[float, float]:
        """(compute, allreduce wait) in seconds per step so far; (0, 0) before any step."""
        if not self._steps:
            return 0.0, 0.0
        return self._compute / self._steps, self._wait / self._steps

    @property
    def full(self) -> bool:
        """Long enough to judge."""
        return self._steps >= PACE_STEPS

    def reset(self) -> None:
        self._steps, self._compute, self._wait = 0, 0.0, 0.0


class Stragglers:
    """Names a rank whose compute per step stayed above RATIO x the others' median (and MARGIN_S more) in each
    of the last WINDOW full paces; once, until it keeps pace again."""

    def __init__(self) -> None:
        self._reports: deque[list[float]] = deque(maxlen=WINDOW)
        self._named: int | None = None

    def observe(self, paces: list[tuple[float, float]]) -> str | None:
        """One full pace's (compute, wait) per rank; a warning line when a straggler is first seen."""
        computes = [compute for compute, _ in paces]
        if len(computes) < 2 or not all(computes):
            return None
        if self._reports and len(self._reports[-1]) != len(computes):
            self._reports.clear()  # an elastic world changed size
        self._reports.append(computes)
        slow = [rank for rank in range(len(computes)) if len(self._reports) == WINDOW
                and all(_slow(report, rank) for report in self._reports)]
        if not slow:
            self._named = None
            return None
        rank = slow[0]
        if rank == self._named:
            return None
        self._named = rank
        mine = statistics.fmean(report[rank] for report in self._reports)
        others = statistics.fmean(_others(report, rank) for report in self._reports)
        return (f"rank {rank} is a straggler: {mine * 1e3:.1f} ms of compute per step against {others * 1e3:.1f} ms "
                f"on the others; the job runs at its pace, {(mine - others) * 1e3:.1f} ms a step slower")


def _others(report: list[float], rank: int) -> float:
    return statistics.median(compute for other, compute in enumerate(report) if other != rank)


def _slow(report: list[float], rank: int) -> bool:
    others = _others(report, rank)
    return report[rank] > RATIO * others and report[rank] - others > MARGIN_S
