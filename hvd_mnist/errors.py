"""Exceptions that end a run with a one-line message and a chosen exit status (see cli.main)."""

from __future__ import annotations

import os
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

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class WriteFailed(RunEnded):
    """Rank 0 could not write an output mid-run (no space, I/O error, read-only file system, quota)."""


class Crashed(RunEnded):
    """An exception hvd_mnist did not expect (a bug, or a failure it cannot name): its traceback is in a file."""


def crashed(error: BaseException, directory: Path | None) -> Crashed:
    """Write the traceback of `error` to a file in `directory` (the run directory on rank 0; the temp directory
    where there is none) and return the one line that points to it; the console never gets the traceback."""
    folder = directory if directory is not None and directory.is_dir() else Path(tempfile.gettempdir())
    path = folder / f"crash-{socket.gethostname()}-{os.getpid()}.log"
    text = "".join(traceback.format_exception(error))
    try:
        path.write_text(text)
    except OSError:
        path = Path(tempfile.mkstemp(prefix="hvd-mnist-crash-", suffix=".log")[1])
        path.write_text(text)
    summary = " ".join(str(error).split())[:300] or "no message"
    return Crashed(f"unexpected {type(error).__name__}: {summary} (traceback in {path})")
