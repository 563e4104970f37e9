"""What rank 0 tells about training: console log lines, a JSON-lines metrics file and TensorBoard events."""

from __future__ import annotations

import json
import logging
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import tensorflow as tf

from hvd_mnist.runtime.supervisor import World, writing

log = logging.getLogger("hvd_mnist")


class Output:
    """One place a rank's training figures go. Each kind takes what it shows and leaves the rest: the loop
    tells every output everything, so it never has to know which of them are there."""

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        """One of metrics.jsonl's events: its kind and fields."""

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Named figures at a step (TensorBoard's scalars)."""

    def histograms(self, step: int, tensors: dict[str, tf.Tensor]) -> None:
        """Named tensors at a step (TensorBoard's histograms)."""

    def close(self) -> None:
        """The run of the loop ended: flush and close what is open (once; later calls do nothing)."""


class MetricsFile(Output):
    """metrics.jsonl, one JSON object per event. Every write goes through `writing`, so a full or failing disk
    ends the run with one line."""

    def __init__(self, path: Path) -> None:
        self._path = path
        with writing("metrics", path):
            drop_torn_last_line(path)
            self._file: TextIO | None = path.open("a", buffering=1)

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        if self._file is not None:
            record = {"event": kind, "time": round(time.time(), 3), **fields}
            with writing("metrics", self._path):
                self._file.write(json.dumps(record, default=float) + "\n")

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            with writing("metrics", self._path):
                file.close()


class TensorBoard(Output):
    """TensorBoard's event files, flushed at each report, so a failing disk shows at once and not at the end."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        with writing("TensorBoard events", directory):
            self._writer: tf.summary.SummaryWriter | None = tf.summary.create_file_writer(str(directory))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._write(step, values, tf.summary.scalar)

    def histograms(self, step: int, tensors: dict[str, tf.Tensor]) -> None:
        self._write(step, tensors, tf.summary.histogram)

    def _write(self, step: int, values: dict[str, Any], summary: Callable[[str, Any], Any]) -> None:
        if self._writer is not None:
            with writing("TensorBoard events", self._directory), self._writer.as_default(step=step):
                for name, value in values.items():
                    summary(name, value)
                self._writer.flush()

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            with writing("TensorBoard events", self._directory):
                writer.flush()
                writer.close()


class Console(Output):
    """Rank 0's progress lines: each report, evaluation, reached target and named straggler, as one log line."""

    def __init__(self, steps: int) -> None:
        self._steps = steps

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        if kind == "train":
            log.info("step %d/%d  loss %.4f  accuracy %.3f  lr %.6f  %.0f examples/sec  %.4f sec/batch",
                     fields["step"], self._steps, fields["loss"], fields["accuracy"], fields["lr"],
                     fields["examples_per_sec"], fields["sec_per_batch"])
        elif kind == "eval":
            log.info("step %d/%d  validation accuracy %.4f  loss %.4f  (%d examples)", fields["step"], self._steps,
                     fields["accuracy"], fields["loss"], fields["examples"])
        elif kind == "target_reached":
            log.info("reached the target validation accuracy %.4f (%.4f) at step %d, %.1f s after start",
                     fields["target"], fields["accuracy"], fields["step"], fields["seconds_since_start"])
        elif kind == "straggler":
            log.warning("%s", fields["message"])


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
