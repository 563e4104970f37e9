"""Exceptions that end a run with a one-line message and a chosen exit status (see cli.main)."""

from __future__ import annotations

import os
import re
import socket
import tempfile
import traceback
from pathlib import Path


class RunEnded(Exception):
    """Base: the CLI prints `hvd-mnist: <label>: <message>` and exits with `exit_code`."""

    label = "error"
    exit_code = 1


class UserError(RunEnded):
    """A problem with the user's input (flags, files, directories), not a bug in hvd_mnist."""

    exit_code = 2


class WorkerLost(RunEnded):
    """Another rank died or became unreachable; the last checkpoint is intact and --resume continues."""


class StopRequested(RunEnded):
    """SIGTERM or Ctrl-C: every rank stopped at the same step and rank 0 wrote a checkpoint."""

    label = "stopped"

    def __init__(self, message: str, exit_code: int, reason: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.reason = reason  # the signal every rank agreed came first


class WriteFailed(RunEnded):
    """Rank 0 could not write an output mid-run (no space, I/O error, read-only file system, quota)."""


class RanOut(RunEnded):
    """A rank ran out of memory, threads or open files: the line names the rank, the resource and its limit."""


class Crashed(RunEnded):
    """An exception hvd_mnist did not expect (a bug, or a failure it cannot name): its traceback is in a file."""


def crashed(error: BaseException, directory: Path | None) -> Crashed:
    """Write the traceback of `error` to a new file in `directory` (the run directory on rank 0), or to a new
    temporary file where there is none or it cannot be written, and return the one line that points to it;
    the console never gets the traceback, even when no file can be written (a full disk)."""
    text = "".join(traceback.format_exception(error))
    summary = " ".join(str(error).split())[:300] or "no message"
    name = f"crash-{socket.gethostname()}-{os.getpid()}"
    try:
        try:
            if directory is None or not directory.is_dir():
                raise FileNotFoundError(directory)
            path = directory / f"{name}.log"
            with open(path, "x") as file:  # never through a link someone left in its place
                file.write(text)
        except OSError:
            handle, temporary = tempfile.mkstemp(prefix=f"hvd-mnist-{name}-", suffix=".log")
            path = Path(temporary)
            with os.fdopen(handle, "w") as file:
                file.write(text)
        where = f"traceback in {path}"
    except OSError as err:
        where = f"its traceback could not be saved: {err.strerror or err}"
    return Crashed(f"unexpected {type(error).__name__}: {summary} ({where})")


def first_line(err: BaseException) -> str:
    """An exception's first line, without TensorFlow's {{function_node ...}} prefix (or its type, if empty)."""
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", str(err)).strip()
    return text.splitlines()[0] if text else type(err).__name__
