"""What rank 0 tells about training: console log lines, a JSON-lines metrics file and TensorBoard events."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import tensorflow as tf

from hvd_mnist.distribution import World

log = logging.getLogger("hvd_mnist")


class Reporter:
    """Writes progress to the console, metrics.jsonl and TensorBoard; on ranks other than 0 it does nothing."""

    def __init__(self, output_dir: Path | None, enabled: bool) -> None:
        self.enabled = enabled and output_dir is not None
        self._metrics = None
        self._writer = None
        if self.enabled:
            self._metrics = (output_dir / "metrics.jsonl").open("a", buffering=1)
            self._writer = tf.summary.create_file_writer(str(output_dir / "events"))

    def event(self, kind: str, **fields: Any) -> None:
        """Append one JSON object to metrics.jsonl."""
        if self._metrics is not None:
            record = {"event": kind, "time": round(time.time(), 3), **fields}
            self._metrics.write(json.dumps(record, default=float) + "\n")

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """TensorBoard scalars at a step."""
        if self._writer is not None:
            with self._writer.as_default(step=step):
                for name, value in values.items():
                    tf.summary.scalar(name, value)

    def histograms(self, step: int, tensors: dict[str, tf.Tensor]) -> None:
        """TensorBoard histograms at a step."""
        if self._writer is not None:
            with self._writer.as_default(step=step):
                for name, tensor in tensors.items():
                    tf.summary.histogram(name, tensor)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
        if self._metrics is not None:
            self._metrics.close()


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


def configure_logging(world: World) -> None:
    """Rank 0 logs progress; the other ranks log warnings and errors only, tagged with their rank.

    TensorFlow's own Python logger is held to errors, so the console shows the run, not the library.
    """
    tag = "" if world.is_chief else f"[rank {world.rank}] "
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {tag}%(message)s", datefmt="%H:%M:%S"))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO if world.is_chief else logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
