"""Rank 0's writes mid-run (checkpoints, metrics, summaries, the export): a failure becomes one line saying
what could not be written, where, and why."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import tensorflow as tf

from hvd_mnist.errors import WriteFailed, first_line
from hvd_mnist.runtime.health.resources import ran_out_of

# The causes a user can act on, found by their text in TensorFlow's messages (which carry no errno).
CAUSES = tuple(os.strerror(code) for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES,
                                               errno.EPERM, errno.ENOENT))


def cause_of(err: BaseException) -> str:
    """'No space left on device' and the like, or the error's first line."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    text = str(err)
    for cause in CAUSES:
        if cause.lower() in text.lower():
            return cause
    return first_line(err)


@contextlib.contextmanager
def writing(what: str, where: Path | str) -> Iterator[None]:
    """Turn a failed write in the block into WriteFailed('could not write WHAT to WHERE: CAUSE')."""
    try:
        yield
    except (OSError, tf.errors.OpError) as err:
        if ran_out_of(err):  # out of open files or memory: the rank's limit, not the disk, is the cause
            raise
        raise WriteFailed(f"could not write {what} to {where}: {cause_of(err).lower()}") from None
