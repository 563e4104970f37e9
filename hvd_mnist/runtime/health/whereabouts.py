"""Where a rank's main thread is and has been, read from its other threads: its last progress, the guarded block
(a collective, or the wait for one) it is in, its innermost frame of interest, and a flight record of its last
guarded blocks. A fresh heartbeat alone only says that the process runs; these say where it is stuck, and the
dump (all threads' stacks and the record) is what a rank writes or sends when a job fails, stalls or is asked
(`hvd-mnist debug`). PyTorch's flight recorder keeps the same for its collectives."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import sysconfig
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hvd_mnist.runtime.boot import native_lines

PACKAGE = Path(__file__).resolve().parents[2]  # hvd_mnist/
LIBRARIES = tuple(str(Path(sysconfig.get_paths()[name]).resolve()) for name in ("stdlib", "purelib", "platlib"))
# HVD_MNIST_FLIGHT_RECORDER=0 keeps only the current block, and leaves the steps' allreduce untimed (the
# benchmark measures the recorder's cost so; TORCH_NCCL_TRACE_BUFFER_SIZE=0 is PyTorch's equivalent).
RECORDING = os.environ.get("HVD_MNIST_FLIGHT_RECORDER", "1") != "0"
RECORDED = 64 if RECORDING else 1  # guarded blocks kept in the flight record
MAX_DUMP_CHARS = 40_000  # a dump travels as one heartbeat message (transport.MAX_LINE)


@dataclass
class Passage:
    """One guarded block on the main thread: entered at wall-clock `entered`, left at `left` (None: still in it)."""

    step: int
    what: str
    nbytes: int | None
    entered: float
    left: float | None = None

    def line(self, now: float) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.entered)) + f".{int(self.entered % 1 * 1000):03d}"
        size = f"  {self.nbytes / 1e6:.2f} MB allreduced" if self.nbytes else ""
        took = (f"{self.left - self.entered:.3f} s" if self.left is not None
                else f"STILL IN IT after {now - self.entered:.1f} s")
        return f"{stamp}  after step {self.step:<7}  {self.what}{size}  {took}"


class Whereabouts:
    """This rank's progress clock and flight record, kept by the main thread and read from any other."""

    def __init__(self) -> None:
        self._progressed = time.monotonic()
        self._main = threading.main_thread().ident
        self._record: deque[Passage] = deque(maxlen=RECORDED)

    def progressed(self) -> None:
        """The main thread finished a training step (or another unit of work)."""
        self._progressed = time.monotonic()

    def since_progress(self) -> float:
        return time.monotonic() - self._progressed

    @contextlib.contextmanager
    def within(self, step: int, what: str, nbytes: int | None = None) -> Iterator[None]:
        """Record a guarded block: its step, what it is, the bytes it allreduces where known, its times."""
        passage = Passage(step, what, nbytes, time.time())
        self._record.append(passage)
        try:
            yield
        finally:
            passage.left = time.time()

    def waiting_in(self) -> str | None:
        """The guarded block the main thread is in now ('averaging the metrics after step 300'), or None."""
        last = self._record[-1] if self._record else None
        return f"{last.what} after step {last.step}" if last is not None and last.left is None else None

    def report(self) -> dict[str, object]:
        """For a heartbeat: seconds since progress, the block waited in (or None), the main thread's frame."""
        return {"since_progress": round(self.since_progress(), 1), "waiting_in": self.waiting_in(),
                "frame": main_thread_frame(self._main)}

    def dump(self, rank: int, why: str) -> str:
        """What a person needs to find where this rank is: its progress, every thread's Python stack, and the
        flight record, newest last (cut to MAX_DUMP_CHARS, keeping the main thread's stack first)."""
        now = time.time()
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        frames = sys._current_frames()
        order = sorted(frames, key=lambda ident: ident != self._main)
        head = [f"hvd_mnist rank {rank} on {socket.gethostname()}, pid {os.getpid()}, "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))}: {why}",
                f"last progress {self.since_progress():.1f} s ago; in a guarded block: {self.waiting_in() or 'no'}"]
        stacks = [f"\n--- thread {names.get(ident, ident)}{' (main)' if ident == self._main else ''}\n"
                  + "".join(traceback.format_stack(frames[ident])) for ident in order]
        record = [f"\n--- flight record: the last {len(self._record)} guarded blocks, newest last"]
        record += [passage.line(now) for passage in list(self._record)]
        held = native_lines.held()
        native = [f"\n--- Horovod's log lines, kept off the console: the last {len(held)}", *held] if held else []
        text = "\n".join(head + stacks[:1] + record + native + stacks[1:]) + "\n"
        return text if len(text) <= MAX_DUMP_CHARS else text[:MAX_DUMP_CHARS] + "\n[cut]\n"


def main_thread_frame(ident: int | None) -> str | None:
    """`path:line function` of the main thread's innermost frame in hvd_mnist's or the user's code (not the
    standard library's or an installed package's, whose frames say little), with paths relative to the repository
    where they can be; the innermost frame of all where there is none."""
    frame = sys._current_frames().get(ident)
    innermost = frame
    while frame is not None and not _of_interest(frame.f_code.co_filename):
        frame = frame.f_back
    frame = frame or innermost
    if frame is None:
        return None
    path = Path(frame.f_code.co_filename)
    with_package = path.resolve()
    shown = with_package.relative_to(PACKAGE.parent) if with_package.is_relative_to(PACKAGE.parent) else path
    return f"{shown}:{frame.f_lineno} {frame.f_code.co_name}"


@functools.cache  # a heartbeat walks the stack every second; its files are few
def _of_interest(filename: str) -> bool:
    path = str(Path(filename).resolve())
    if path.startswith(str(PACKAGE)):
        return True
    return not filename.startswith("<") and not path.startswith(LIBRARIES)
