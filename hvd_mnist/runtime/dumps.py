"""The run directory's debug/ folder: each rank's dump (its stacks and flight record) as rank-K.txt, written by
rank 0 when a job fails or stalls, or when `hvd-mnist debug RUN_DIR` asks a running job for one.

The request is a file, debug/request, that rank 0 looks for every second from a thread of its own: it works
while the main thread is blocked in a collective (where a Python signal handler would wait), needs no process
id, and reaches rank 0 on another host through a shared run directory.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hvd_mnist.runtime.rundir import RunDir

POLL_S = 1.0
ANSWER_WAIT_S = 30.0  # how long `hvd-mnist debug` waits for rank 0 to write the dumps


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


def running(run_dir: RunDir) -> bool:
    """A job holds the run directory's lock (runtime.rundir.claim) now."""
    try:
        fd = os.open(run_dir.lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def main(argv: list[str]) -> int:
    """`hvd-mnist debug RUN_DIR`: ask the job running in RUN_DIR for every rank's dump, without stopping it."""
    parser = argparse.ArgumentParser(prog="hvd-mnist debug", description=main.__doc__)
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the --output-dir of a running job")
    parser.add_argument("--wait", type=float, default=ANSWER_WAIT_S, metavar="S",
                        help="how long to wait for rank 0's answer (default: %(default)s)")
    args = parser.parse_args(argv)
    run_dir = RunDir(args.run_dir)
    if not running(run_dir):
        print(f"hvd-mnist debug: error: no job is running in {run_dir} (nothing holds its lock); a job that "
              f"failed or stalled left its dumps in {run_dir.debug}/", file=sys.stderr)
        return 1
    run_dir.debug.mkdir(exist_ok=True)
    asked = time.time()
    run_dir.debug_request.write_text(f"asked by hvd-mnist debug at {time.strftime('%H:%M:%S')}\n")
    deadline = time.monotonic() + args.wait
    while run_dir.debug_request.exists():
        if time.monotonic() > deadline:
            run_dir.debug_request.unlink(missing_ok=True)
            print(f"hvd-mnist debug: error: rank 0 did not answer within {args.wait:.0f} s (is it stopped, or is "
                  f"{run_dir} not shared with its host?)", file=sys.stderr)
            return 1
        time.sleep(0.2)
    written = [path for path in sorted(run_dir.debug.glob("rank-*.txt")) if path.stat().st_mtime >= asked - 1]
    if not written:
        print(f"hvd-mnist debug: error: rank 0 answered but could not write {run_dir.debug}/ (its log says why)",
              file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0
