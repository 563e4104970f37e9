"""A watchdog that ends the process when one guarded block (a collective, or the wait for one) runs too long."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator


class Watchdog:
    """Ends the process when a watched block takes longer than the timeout.

    A thread of its own, since the main thread is blocked inside Horovod's op, which no Python code can
    interrupt. `on_timeout` decides: it returns True to keep waiting (elastic runs, after killing a stopped
    peer so that Horovod sees it fail) or writes the one-line error, after which the process exits.
    """

    def __init__(self, timeout: float, on_timeout: Callable[[int, str], bool]) -> None:
        self.timeout = timeout
        self._on_timeout = on_timeout
        self._armed: tuple[float, int, str] | None = None
        self._lock = threading.Lock()
        if timeout > 0:
            threading.Thread(target=self._watch, name="hvd-mnist-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def watching(self, step: int, what: str) -> Iterator[None]:
        """Arm the watchdog for the block: it must finish within the timeout."""
        with self._lock:
            self._armed = (time.monotonic(), step, what)
        try:
            yield
        finally:
            with self._lock:
                self._armed = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 10))
            with self._lock:
                armed = self._armed
            if armed is None or time.monotonic() - armed[0] < self.timeout:
                continue
            _, step, what = armed
            if self._on_timeout(step, what):
                with self._lock:
                    if self._armed is armed:
                        self._armed = (time.monotonic(), step, what)
                continue
            sys.stderr.flush()
            os._exit(1)
