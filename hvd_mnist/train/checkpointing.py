"""Checkpoints: what a run saves (step, weights, optimizer, moving averages), where, and how it comes back.

A save writes ckpt-<step>'s files, then commits them by rewriting the `checkpoint` state file atomically.
A restore tries the checkpoints newest first and takes the first that reads back whole: TensorFlow checks
every tensor's CRC as it restores, so the restore is the verification, on rank 0 alone, and no second read.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

from hvd_mnist.errors import UserError, first_line

log = logging.getLogger("hvd_mnist")
STATE_FILE = "checkpoint"


class Checkpoints:
    """A tf.train.Checkpoint with two managers: the last few in `directory`, and the best one in `best_directory`
    (with --keep-best). Only rank 0 saves or restores; the managers are made when first used."""

    def __init__(self, directory: Path, best_directory: Path, keep: int, **trackables: tf.Module | tf.Variable) -> None:
        self.directory = directory
        self.best_directory = best_directory
        self.keep = keep
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self._managers: dict[Path, tf.train.CheckpointManager] = {}

    def _manager(self, directory: Path) -> tf.train.CheckpointManager:
        if directory not in self._managers:
            if not readable_state(directory):
                log.warning("%s is damaged; a new one will name the checkpoints from here on", directory / STATE_FILE)
                (directory / STATE_FILE).unlink()
            keep = self.keep if directory == self.directory else 1
            self._managers[directory] = tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=keep)
        return self._managers[directory]

    @property
    def latest(self) -> str | None:
        return self._manager(self.directory).latest_checkpoint

    @property
    def best(self) -> str | None:
        return self._manager(self.best_directory).latest_checkpoint

    def save(self, step: int, before_commit: Callable[[], None] | None = None) -> str:
        """Write ckpt-<step>'s files, then commit it by rewriting the 'checkpoint' state file atomically.

        A crash before the commit leaves the state naming the previous checkpoint, so a restore never
        picks up a half-written one first. `before_commit` runs between the two (a fault-injection point).
        """
        callbacks = [lambda _path: before_commit()] if before_commit else None
        options = tf.train.CheckpointOptions(experimental_write_callbacks=callbacks)
        try:
            return self._manager(self.directory).save(checkpoint_number=step, options=options)
        except Exception:
            self._remove_uncommitted(step)  # what a failed write left (a full disk gets its space back)
            raise

    def _remove_uncommitted(self, step: int) -> None:
        for path in self.directory.glob(f"ckpt-{step}[._]*"):
            with contextlib.suppress(OSError):
                shutil.rmtree(path) if path.is_dir() else path.unlink()

    def save_best(self, step: int) -> str:
        """Replace the best checkpoint with this step's state (committed the same way as save)."""
        return self._manager(self.best_directory).save(checkpoint_number=step)

    def restore_newest_intact(self, start: Path | None = None) -> str:
        """Restore the newest checkpoint that reads back whole (in `start`, a directory or one checkpoint,
        or this run's); each damaged one is named in a warning and skipped.

        A checkpoint that reads back but does not fit the model is an error at once: the others will not
        fit either.
        """
        if start is not None and not start.is_dir():
            problem = self._try(str(start))
            if problem:
                raise UserError(f"--resume-from: checkpoint {start} is damaged: {problem}")
            return str(start)
        directory = start or self.directory
        tried = []
        for path in candidates(directory):
            problem = self._try(path)
            if problem is None:
                return path
            log.warning("checkpoint %s is damaged (%s); trying an older one", path, problem)
            tried.append(f"{Path(path).name} ({problem})")
        if not tried:
            raise UserError(f"--resume: no checkpoint in {directory}")
        raise UserError(f"--resume: no intact checkpoint in {directory}; tried {', '.join(tried)}")

    def _try(self, path: str) -> str | None:
        """Restore `path` into the tracked objects; None if it worked, else what is wrong with the files."""
        status = None
        try:
            status = self.checkpoint.restore(path)
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError) as err:
            if status is not None:
                status.expect_partial()  # said here in one line; TF would repeat it as warnings at exit
            raise UserError(f"--resume: checkpoint {path} does not fit this model: {first_line(err)}") from None
        except Exception as err:  # any other failure to read the files back is damage
            return first_line(err)
        return None


def readable_state(directory: Path) -> bool:
    """Whether the directory's `checkpoint` state file is absent or parses (a truncated one does not)."""
    if not (directory / STATE_FILE).exists():
        return True
    try:
        tf.train.get_checkpoint_state(str(directory))
    except (ValueError, tf.errors.OpError):
        return False
    return True


def candidates(directory: Path) -> list[str]:
    """Checkpoint prefixes to try, newest first: those the state file commits, then any other ckpt-N on disk
    (when the state file is damaged or names files that are gone)."""
    named = []
    if readable_state(directory):
        state = tf.train.get_checkpoint_state(str(directory))
        if state is not None:
            named = [str(directory / Path(path).name) for path in state.all_model_checkpoint_paths]
    on_disk = {str(path.with_suffix("")) for path in directory.glob("ckpt-*.index")}
    on_disk |= {str(path).split(".data-")[0] for path in directory.glob("ckpt-*.data-*")}
    return sorted(named, key=step_of, reverse=True) + sorted(on_disk - set(named), key=step_of, reverse=True)


def step_of(path: str) -> int:
    found = re.search(r"-(\d+)$", path)
    return int(found[1]) if found else -1
