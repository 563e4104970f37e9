"""Checkpoints: what a run saves (step, weights, optimizer, moving averages), where, and how it restores."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

from hvd_mnist.errors import UserError

BEST_DIR = "best"


class Checkpoints:
    """A tf.train.Checkpoint with two managers under <output_dir>/checkpoints: the last few, and the best one
    (in best/, with --keep-best). Rank 0 saves."""

    def __init__(self, directory: Path, keep: int, **trackables: tf.Module | tf.Variable) -> None:
        self.directory = directory
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=keep)
        self.best_manager = tf.train.CheckpointManager(self.checkpoint, str(directory / BEST_DIR), max_to_keep=1)

    @property
    def latest(self) -> str | None:
        return self.manager.latest_checkpoint

    @property
    def best(self) -> str | None:
        return self.best_manager.latest_checkpoint

    def save(self, step: int, before_commit: Callable[[], None] | None = None) -> str:
        """Write ckpt-<step>'s files, then commit it by rewriting the 'checkpoint' index file atomically.

        A crash before the commit leaves the index naming the previous checkpoint, so a restore never
        picks up a half-written one. `before_commit` runs between the two (a fault-injection point).
        """
        callbacks = [lambda _path: before_commit()] if before_commit else None
        options = tf.train.CheckpointOptions(experimental_write_callbacks=callbacks)
        return self.manager.save(checkpoint_number=step, options=options)

    def save_best(self, step: int) -> str:
        """Replace the best checkpoint with this step's state (committed the same way as save)."""
        return self.best_manager.save(checkpoint_number=step)

    def restore_latest(self) -> str:
        """Load the newest checkpoint into the tracked objects, insisting that it matches them."""
        path = self.latest
        if path is None:
            raise UserError(f"--resume: no checkpoint in {self.directory}")
        try:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as err:
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(f"--resume: checkpoint {path} does not fit this model: {first_line}") from None
        return path
