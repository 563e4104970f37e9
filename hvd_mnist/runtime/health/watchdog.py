"""A watchdog that ends the process when one guarded block (a collective, or the wait for one) runs too long, or
goes on waiting for a peer that is known to be gone."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

HOPELESS_GRACE_S = 10.0  # how long a block may wait on a peer known to be gone, for its own error to come first


class Watchdog:
    """Ends the process when a watched block takes longer than the timeout, or when `hopeless()` has said for
    HOPELESS_GRACE_S that waiting cannot help (a peer died). MPI's collectives do not fail when a peer on
    another node dies with its node: without this, the survivors would wait out the whole timeout, and a
    scheduler's SIGTERM, which they cannot act on while blocked, would be followed by its SIGKILL first.

    A thread of its own, since the main thread is blocked inside Horovod's op, which no Python code can
    interrupt. `on_timeout(step, what, waited)` decides: it returns True to keep waiting (elastic runs, after
    killing a stopped peer so that Horovod sees it fail) or writes the one-line error, after which the process
    exits.
    """

    def __init__(self, timeout: float, on_timeout: Callable[[int, str, float], bool],
                 hopeless: Callable[[], bool] = lambda: False) -> None:
        self.timeout = timeout
        self._on_timeout = on_timeout
        self._hopeless = hopeless
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
        hopeless_since = None
        while True:
            time.sleep(min(1.0, self.timeout / 10))
            with self._lock:
                armed = self._armed
            now = time.monotonic()
            if armed is None or (now - armed[0] < self.timeout and not self._hopeless()):
                hopeless_since = None
                continue
            if now - armed[0] < self.timeout:
                hopeless_since = hopeless_since or now
                if now - hopeless_since < HOPELESS_GRACE_S:
                    continue
            _, step, what = armed
            if self._on_timeout(step, what, now - armed[0]):
                with self._lock:
                    if self._armed is armed:
                        self._armed = (time.monotonic(), step, what)
                continue
            sys.stderr.flush()
            os._exit(1)
