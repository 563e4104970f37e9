"""Graceful stop on SIGTERM or Ctrl-C, or when the launcher is gone: finish the step, agree across ranks,
checkpoint, exit."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType

from hvd_mnist.runtime.boot.startup import LAUNCHER_PID

LAUNCHER_POLL_S = 1.0


class StopSignal:
    """Remembers the first SIGTERM/SIGINT, which is the cause every rank reports; a second Ctrl-C ends the process
    at once, while a later SIGTERM is only noted: it is what launchers send to the ranks left once one rank has
    stopped, and it must neither kill rank 0 in the middle of its checkpoint nor replace the user's signal.

    The flag is averaged over the ranks with the metrics every few steps, so a signal that reaches one
    rank (say, rank 0 under a scheduler) stops every rank at the same step. A rank whose launcher died
    (`kill -9 mpirun`: the ranks are orphaned and would train on with nobody to report to) stops the same
    way, as on a hang-up, so the run still ends with a checkpoint instead of running on unseen.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.received_at = 0.0  # wall-clock time of the first signal, to find the first across ranks
        self._previous = {}
        self._unwatched = threading.Event()
        self._unwatched.set()  # set: no watch thread runs

    def install(self, watch_launcher: bool) -> None:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        if watch_launcher and self._unwatched.is_set():
            self._unwatched.clear()
            threading.Thread(target=self._watch, name="hvd-mnist-launcher-watch", daemon=True).start()

    def uninstall(self) -> None:
        if self.signum is not None:  # stopping: a launcher's SIGTERM may still come while this rank ends
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        self._unwatched.set()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self._record(signum)
        if signum == signal.SIGINT:
            signal.signal(signum, signal.SIG_DFL)

    def _record(self, signum: int) -> None:
        """The first cause wins: whatever comes later is a consequence of it (or the user insisting)."""
        if self.signum is None:
            self.signum, self.received_at = signum, time.time()

    def _watch(self) -> None:
        while not self._unwatched.wait(LAUNCHER_POLL_S):
            if os.getppid() != LAUNCHER_PID:  # re-parented: the process that started this rank is gone
                self._record(signal.SIGHUP)
                return

    @property
    def request(self) -> tuple[float, int] | None:
        """(when, which signal) this rank was asked to stop, to be compared with the other ranks' (first_cause)."""
        return None if self.signum is None else (self.received_at, self.signum)

    @property
    def vote(self) -> float:
        """1.0 once a signal arrived on this rank, else 0.0."""
        return 0.0 if self.signum is None else 1.0


def first_cause(requests: list[tuple[float, int] | None]) -> int:
    """The signal that came first on any rank, given every rank's `request` (SIGTERM if none is known)."""
    known = sorted(request for request in requests if request is not None)
    return known[0][1] if known else signal.SIGTERM


def describe(signum: int) -> str:
    """A stop's cause for the one-line message and metrics.jsonl."""
    if signum == signal.SIGHUP:
        return "the launcher is gone (its ranks were orphaned)"
    return signal.Signals(signum).name
