"""Graceful stop on SIGTERM or Ctrl-C, or when the launcher is gone: finish the step, agree across ranks,
checkpoint, exit."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from hvd_mnist.runtime.startup import LAUNCHER_PID

LAUNCHER_POLL_S = 1.0


class StopSignal:
    """Remembers the first SIGTERM/SIGINT; a second one gets the default behaviour (immediate exit).

    The flag is averaged over the ranks with the metrics every few steps, so a signal that reaches one
    rank (say, rank 0 under a scheduler) stops every rank at the same step. A rank whose launcher died
    (`kill -9 mpirun`: the ranks are orphaned and would train on with nobody to report to) stops the same
    way, as on a hang-up, so the run still ends with a checkpoint instead of running on unseen.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
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
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        self._unwatched.set()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum
        signal.signal(signum, signal.SIG_DFL)

    def _watch(self) -> None:
        while not self._unwatched.wait(LAUNCHER_POLL_S):
            if os.getppid() != LAUNCHER_PID:  # re-parented: the process that started this rank is gone
                self.signum = self.signum or signal.SIGHUP
                return

    @property
    def reason(self) -> str:
        """What asked this rank to stop, for the one-line message."""
        if self.signum == signal.SIGHUP:
            return "the launcher is gone (its ranks were orphaned)"
        return signal.Signals(self.signum).name if self.signum else "a signal on another rank"

    @property
    def vote(self) -> float:
        """1.0 once a signal arrived on this rank, else 0.0."""
        return 0.0 if self.signum is None else 1.0

    def exit_code(self) -> int:
        """128 + the signal number, as shells report; SIGTERM when the request came from another rank."""
        return 128 + (self.signum or signal.SIGTERM)
