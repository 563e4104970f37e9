"""The run directory: its named paths, choosing it, refusing to clobber an old run, proving it writable, the
configuration it records, and the lock that keeps a second run out of it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from hvd_mnist.config import TrainConfig, flag
from hvd_mnist.config_file import changes, experiment_toml, load
from hvd_mnist.errors import UserError

DEFAULT_ROOT = Path("runs")
# Checkpoints (kept ones plus the one being written), events and the export of the largest model fit in this.
MIN_FREE_BYTES = 256 * 2**20
LOCKLESS_ERRNOS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
ELASTIC_CLAIM_WAIT_S = 10.0
log = logging.getLogger("hvd_mnist")
_claimed: dict[Path, int] = {}  # run directory -> its locked descriptor, held until this process exits


@dataclass(frozen=True)
class RunDir:
    """A run directory and the names of what rank 0 writes in it: every module asks here, none joins strings."""

    path: Path
    # What this launch changed in the configuration the run kept ({field: (before, now)}): a resume with flags.
    config_changes: dict[str, tuple[object, object]] = field(default_factory=dict, compare=False)

    @property
    def config(self) -> Path:
        """The run's effective configuration; each one a resume replaced is kept as config.1.toml, ..."""
        return self.path / "config.toml"

    def earlier_config(self) -> Path:
        """A free name for the configuration a resume with other flags replaces."""
        number = 1
        while (self.path / f"config.{number}.toml").exists():
            number += 1
        return self.path / f"config.{number}.toml"

    @property
    def metrics(self) -> Path:
        """One JSON object per line: start, train, eval, target_reached, stopped and end events."""
        return self.path / "metrics.jsonl"

    @property
    def plot(self) -> Path:
        return self.path / "metrics.png"

    @property
    def events(self) -> Path:
        """TensorBoard's event files."""
        return self.path / "events"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def best_checkpoints(self) -> Path:
        return self.checkpoints / "best"

    @property
    def export(self) -> Path:
        return self.path / "export"

    @property
    def timeline(self) -> Path:
        return self.path / "timeline.json"

    @property
    def debug(self) -> Path:
        """Each rank's stacks and flight record, rank-K.txt, from a failed or stalled job or `hvd-mnist debug`."""
        return self.path / "debug"

    @property
    def debug_request(self) -> Path:
        return self.debug / "request"

    @property
    def lock(self) -> Path:
        return self.path / ".lock"

    def __str__(self) -> str:
        return str(self.path)


def default_run_dir() -> Path:
    """runs/run-<UTC timestamp>, like Lightning's versioned log directories."""
    return DEFAULT_ROOT / time.strftime("run-%Y%m%d-%H%M%S", time.gmtime())


def prepare_run_dir(config: TrainConfig) -> RunDir:
    """Create (or, with --resume, reopen) the run directory and check it can be written; rank 0 only."""
    run_dir = RunDir(Path(config.output_dir) if config.output_dir is not None else default_run_dir())
    if config.elastic and run_dir.config.is_file() and run_dir.config.read_text() == experiment_toml(config):
        claim(run_dir, wait_s=ELASTIC_CLAIM_WAIT_S)  # a worker (re)joining this elastic job as rank 0
        return run_dir
    if run_dir.path.is_dir():
        claim(run_dir)  # a run still going holds it: stop before anything in it is replaced or resumed
    if config.resume:
        if not run_dir.checkpoints.is_dir():
            raise UserError(f"--resume: no checkpoints in {run_dir}")
        run_dir = RunDir(run_dir.path, resumed_changes(run_dir, config))
    elif config.resume_from is not None:
        pass  # a new run directory, or this run's own, continued from the given checkpoint
    elif run_dir.path.exists() and any(path != run_dir.lock for path in run_dir.path.iterdir()):
        if not config.overwrite:
            raise UserError(f"{run_dir} already holds a run; pass --resume to continue it or --overwrite to replace it")
        for path in run_dir.path.iterdir():  # all but the lock this process holds
            if path != run_dir.lock:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    try:
        run_dir.path.mkdir(parents=True, exist_ok=True)
        claim(run_dir)
        probe = run_dir.path / ".write_probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise UserError(f"cannot write to the output directory {run_dir}: {err.strerror}") from None
    free = shutil.disk_usage(run_dir.path).free
    if free < MIN_FREE_BYTES:
        raise UserError(f"the output directory {run_dir} has {free / 2**20:.1f} MiB free; "
                        f"checkpoints and exports need at least {MIN_FREE_BYTES // 2**20} MiB")
    if run_dir.config_changes and run_dir.config.is_file():
        kept = run_dir.earlier_config()
        os.link(run_dir.config, kept)  # the earlier configuration stays whole, under a name of its own
        log.info("resuming %s with %s changed (its earlier configuration is kept as %s)", run_dir,
                 ", ".join(f"{flag(name)} {before} -> {now}" for name, (before, now) in run_dir.config_changes.items()),
                 kept.name)
    tmp = run_dir.config.with_suffix(".toml.tmp")
    tmp.write_text(experiment_toml(config))
    tmp.replace(run_dir.config)
    return run_dir


def resumed_changes(run_dir: RunDir, config: TrainConfig) -> dict[str, tuple[object, object]]:
    """What the flags given now change in the configuration the run kept; UserError for a change its
    checkpoints cannot take (another model: other variables), before anything is written."""
    if not run_dir.config.is_file():
        return {}
    changed = changes(load(run_dir.config), config)
    if "model" in changed:
        before, now = changed["model"]
        raise UserError(f"--resume: {run_dir} trains --model {before}; its checkpoints cannot continue as --model "
                        f"{now} (leave --model out, or start a new run in another --output-dir)")
    return changed


def claim(run_dir: RunDir, wait_s: float = 0.0) -> None:
    """Hold an exclusive lock on the run directory for the life of this process, so that a second run pointed
    at it (a double submit, a retry while the first still runs) stops at once instead of replacing or
    interleaving the first's files. The kernel drops the lock when the process ends, however it ends.

    `wait_s`: how long to wait for a holder that is ending (elastic: the rank 0 that was just lost). A file
    system without locks (NFS without lockd, Lustre without flock) gets a warning, not a failed run.
    """
    key = run_dir.path.resolve()
    if key in _claimed:
        return
    lock = run_dir.lock
    try:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            fd = os.open(lock, os.O_RDONLY)  # a shared run directory's lock made by another user: flock works
    except OSError as err:
        raise UserError(f"cannot write to the output directory {run_dir}: {err.strerror}") from None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise UserError(f"{run_dir} is in use by a run still going ({holder}); wait for it or stop it, or "
                            "choose another --output-dir") from None
        except OSError as err:
            if err.errno not in LOCKLESS_ERRNOS:
                raise
            log.warning("cannot lock %s (%s): a second run pointed at this directory will not be stopped", lock,
                        err.strerror)
            break
    with contextlib.suppress(OSError):  # who holds it, for the second run's message; optional
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{socket.gethostname()}, pid {os.getpid()}".encode(), 0)
    _claimed[key] = fd


def in_use(run_dir: RunDir) -> bool:
    """A run holds the directory's lock (claim) now: `hvd-mnist debug` asks only a job that is running."""
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
