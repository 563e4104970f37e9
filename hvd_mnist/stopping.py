"""Graceful stop on SIGTERM or Ctrl-C: finish the step, agree across ranks, checkpoint, exit."""

from __future__ import annotations

import signal
from types import FrameType


class StopSignal:
    """Remembers the first SIGTERM/SIGINT; a second one gets the default behaviour (immediate exit).

    The flag is averaged over the ranks with the metrics every few steps, so a signal that reaches one
    rank (say, rank 0 under a scheduler) stops every rank at the same step.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {}

    def install(self) -> None:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum
        signal.signal(signum, signal.SIG_DFL)

    @property
    def vote(self) -> float:
        """1.0 once a signal arrived on this rank, else 0.0."""
        return 0.0 if self.signum is None else 1.0

    def exit_code(self) -> int:
        """128 + the signal number, as shells report; SIGTERM when the request came from another rank."""
        return 128 + (self.signum or signal.SIGTERM)
