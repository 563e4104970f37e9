"""The run directory: choose it, refuse to clobber an old run, prove it is writable, record the config."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from hvd_mnist.config import TrainConfig
from hvd_mnist.errors import UserError

DEFAULT_ROOT = Path("runs")
# Checkpoints (kept ones plus the one being written), events and the export of the largest model fit in this.
MIN_FREE_BYTES = 256 * 2**20


def default_run_dir() -> Path:
    """runs/run-<UTC timestamp>, like Lightning's versioned log directories."""
    return DEFAULT_ROOT / time.strftime("run-%Y%m%d-%H%M%S", time.gmtime())


def prepare_run_dir(config: TrainConfig) -> Path:
    """Create (or, with --resume, reopen) the run directory and check it can be written; rank 0 only."""
    run_dir = Path(config.output_dir) if config.output_dir is not None else default_run_dir()
    config_file = run_dir / "config.json"
    if config.elastic and config_file.is_file() and config_file.read_text() == config.to_json() + "\n":
        return run_dir  # a worker (re)joining this elastic job as rank 0
    if config.resume:
        if not (run_dir / "checkpoints").is_dir():
            raise UserError(f"--resume: no checkpoints in {run_dir}")
    elif config.resume_from is not None:
        pass  # a new run directory, or this run's own, continued from the given checkpoint
    elif run_dir.exists() and any(run_dir.iterdir()):
        if not config.overwrite:
            raise UserError(f"{run_dir} already holds a run; pass --resume to continue it or --overwrite to replace it")
        shutil.rmtree(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise UserError(f"cannot write to the output directory {run_dir}: {err.strerror}") from None
    free = shutil.disk_usage(run_dir).free
    if free < MIN_FREE_BYTES:
        raise UserError(f"the output directory {run_dir} has {free / 2**20:.1f} MiB free; "
                        f"checkpoints and exports need at least {MIN_FREE_BYTES // 2**20} MiB")
    tmp = config_file.with_suffix(".json.tmp")
    tmp.write_text(config.to_json() + "\n")
    tmp.replace(config_file)
    return run_dir
