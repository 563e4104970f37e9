"""What rank 0 tells about training: console log lines, a JSON-lines metrics file and TensorBoard events."""

from __future__ import annotations

import contextlib
import json
import logging
import select
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf

from hvd_mnist.errors import WriteFailed
from hvd_mnist.runtime.distribution import World
from hvd_mnist.runtime.rundir import RunDir
from hvd_mnist.runtime.writes import writing

log = logging.getLogger("hvd_mnist")
Listener = Callable[[str, dict[str, Any]], None]  # told each event: its kind and fields


class Reporter:
    """Writes progress to metrics.jsonl and TensorBoard; on ranks other than 0 it does nothing.

    Every write goes through `writing`, so a full or failing disk ends the run with one line; TensorBoard
    events are flushed at each report, so such a failure shows at once and not only at the end.
    """

    def __init__(self, run_dir: RunDir | None, enabled: bool, listeners: Sequence[Listener] = ()) -> None:
        self.enabled = enabled and run_dir is not None
        self._listeners = listeners if self.enabled else ()
        self._metrics = None
        self._writer = None
        if self.enabled:
            self._metrics_path = run_dir.metrics
            self._events_dir = run_dir.events
            with writing("metrics", self._metrics_path):
                drop_torn_last_line(self._metrics_path)
                self._metrics = self._metrics_path.open("a", buffering=1)
            with writing("TensorBoard events", self._events_dir):
                self._writer = tf.summary.create_file_writer(str(self._events_dir))

    def event(self, kind: str, **fields: Any) -> None:
        """Append one JSON object to metrics.jsonl, and show it to the listeners (Prometheus, MLflow)."""
        for listener in self._listeners:
            listener(kind, fields)
        if self._metrics is not None:
            record = {"event": kind, "time": round(time.time(), 3), **fields}
            with writing("metrics", self._metrics_path):
                self._metrics.write(json.dumps(record, default=float) + "\n")

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """TensorBoard scalars at a step."""
        if self._writer is not None:
            with writing("TensorBoard events", self._events_dir), self._writer.as_default(step=step):
                for name, value in values.items():
                    tf.summary.scalar(name, value)
                self._writer.flush()

    def histograms(self, step: int, tensors: dict[str, tf.Tensor]) -> None:
        """TensorBoard histograms at a step."""
        if self._writer is not None:
            with writing("TensorBoard events", self._events_dir), self._writer.as_default(step=step):
                for name, tensor in tensors.items():
                    tf.summary.histogram(name, tensor)
                self._writer.flush()

    def close(self) -> None:
        """Flush and close both files (once; later calls do nothing)."""
        writer, metrics, self._writer, self._metrics = self._writer, self._metrics, None, None
        if writer is not None:
            with writing("TensorBoard events", self._events_dir):
                writer.flush()
                writer.close()
        if metrics is not None:
            with writing("metrics", self._metrics_path):
                metrics.close()


@contextlib.contextmanager
def reporting(run_dir: RunDir, enabled: bool, listeners: Sequence[Listener] = ()) -> Iterator[Reporter]:
    """A Reporter for the block, closed once at its end; a run already failing keeps its first cause even if
    closing fails too."""
    reporter = Reporter(run_dir, enabled, listeners)
    try:
        yield reporter
    except BaseException:
        with contextlib.suppress(WriteFailed):
            reporter.close()
        raise
    reporter.close()


def drop_torn_last_line(path: Path) -> None:
    """Cut a line that a crash or a full disk left half-written, so the file stays one JSON object per line."""
    if not path.exists():
        return
    with path.open("rb+") as handle:
        data = handle.read()
        if data and not data.endswith(b"\n"):
            handle.truncate(data.rfind(b"\n") + 1)


class Throughput:
    """Examples/sec and sec/batch over the steps since the last reading."""

    def __init__(self, global_batch: int) -> None:
        self.global_batch = global_batch
        self._start = time.perf_counter()
        self._steps = 0

    def tick(self, steps: int) -> None:
        self._steps += steps

    def read(self) -> tuple[float, float]:
        """(global examples/sec, sec/batch) since the last read, then start a new interval."""
        elapsed = time.perf_counter() - self._start
        steps = max(self._steps, 1)
        self._start, self._steps = time.perf_counter(), 0
        return self.global_batch * steps / elapsed, elapsed / steps


class ConsoleHandler(logging.StreamHandler):
    """stderr, except that a line which would block is dropped: mpirun stops reading its ranks' output once it
    is told to end the job, then waits `odls_base_sigkill_timeout` before it passes the SIGTERM on, and a rank
    blocked writing to the full pipe could not act on it (no stop, no checkpoint) before the SIGKILL."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            writable = bool(select.select([], [self.stream], [], 0)[1])
        except (OSError, ValueError):  # not a file descriptor (a test's captured stream): it cannot block
            writable = True
        if writable:  # a pipe is writable with PIPE_BUF bytes free, and a log line is shorter: it cannot block
            super().emit(record)


def configure_logging(world: World) -> None:
    """Rank 0 logs progress; the other ranks log warnings and errors only, tagged with their rank.

    TensorFlow's own Python logger is held to errors, so the console shows the run, not the library.
    """
    tag = "" if world.is_chief else f"[rank {world.rank}] "
    handler = ConsoleHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {tag}%(message)s", datefmt="%H:%M:%S"))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO if world.is_chief else logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
