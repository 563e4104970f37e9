"""Graceful stop on SIGTERM or Ctrl-C: finish the step, agree across ranks, checkpoint, exit."""

from __future__ import annotations

import signal
from types import FrameType

import tensorflow as tf


class StopSignal:
    """Remembers the first SIGTERM/SIGINT; a second one gets the default behaviour (immediate exit).

    The flag travels in each step's metrics allreduce, so a signal that reaches one rank (say, rank 0
    under a scheduler) stops every rank at the same step without an extra collective.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._flags = (tf.constant(0.0), tf.constant(1.0))
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
    def flag(self) -> tf.Tensor:
        """1.0 once a signal arrived on this rank, else 0.0 (fed to the training step)."""
        return self._flags[self.signum is not None]

    def exit_code(self) -> int:
        """128 + the signal number, as shells report; SIGTERM when the request came from another rank."""
        return 128 + (self.signum or signal.SIGTERM)
