"""The run directory's debug/ folder: each rank's dump (its stacks and flight record) as rank-K.txt, written by
rank 0 when a job fails or stalls, or when `hvd-mnist debug RUN_DIR` (hvd_mnist/debug.py) asks a running job.

The request is a file, debug/request, that rank 0 looks for every second from a thread of its own: it works
while the main thread is blocked in a collective (where a Python signal handler would wait), needs no process
id, and reaches rank 0 on another host through a shared run directory.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hvd_mnist.runtime.storage.rundir import RunDir

POLL_S = 1.0


def write_dumps(directory: Path, dumps: dict[int, str]) -> str | None:
    """Write rank-K.txt for each dump (each whole or not at all); the reason if they could not be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for rank, text in sorted(dumps.items()):
            temporary = directory / f".rank-{rank}.txt.tmp"
            temporary.write_text(text)
            temporary.replace(directory / f"rank-{rank}.txt")
    except OSError as err:
        return err.strerror or str(err)
    return None


def watch_requests(run_dir: RunDir, answer: Callable[[str], None]) -> None:
    """Rank 0: answer each debug/request (its text says who asked) from a daemon thread, then remove it."""

    def watch() -> None:
        while True:
            time.sleep(POLL_S)
            try:
                who = run_dir.debug_request.read_text().strip() or "asked"
            except OSError:
                continue
            answer(who)
            with contextlib.suppress(OSError):
                run_dir.debug_request.unlink()

    threading.Thread(target=watch, name="hvd-mnist-debug-requests", daemon=True).start()
