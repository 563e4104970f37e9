"""Exceptions that end a run with a one-line message and a chosen exit status (see cli.main)."""


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
