"""Checkpoints: what a run saves (step, weights, optimizer, moving averages), where, and how it restores."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from hvd_mnist.errors import UserError


class Checkpoints:
    """A tf.train.Checkpoint and its CheckpointManager under <output_dir>/checkpoints (rank 0 saves)."""

    def __init__(self, directory: Path, keep: int, **trackables: tf.Module) -> None:
        self.directory = directory
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=keep)

    @property
    def latest(self) -> str | None:
        return self.manager.latest_checkpoint

    def save(self, step: int) -> str:
        """Write ckpt-<step>; the 'checkpoint' index file is updated only after the data is complete."""
        return self.manager.save(checkpoint_number=step)

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
