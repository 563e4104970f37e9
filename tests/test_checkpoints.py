"""Restoring: the newest intact checkpoint wins; each kind of damage is named and skipped; a checkpoint of another
model is refused at once. In-process on real checkpoint files (the end-to-end run is in test_reliability)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import tensorflow as tf
from helpers import flip_a_byte

from hvd_mnist.config import TrainConfig
from hvd_mnist.errors import UserError
from hvd_mnist.train.checkpointing import Checkpoints
from hvd_mnist.train.replica import Replica

STEPS = (10, 20, 30)


def checkpoints_of(directory: Path, model: str = "mlp") -> tuple[Replica, Checkpoints]:
    replica = Replica(TrainConfig(model=model), 1)
    best = directory.with_name(directory.name + "-best")
    return replica, Checkpoints(directory, best, keep=3, **replica.trackables())


@pytest.fixture
def run(tmp_path) -> Path:
    """ckpt-10, ckpt-20 and ckpt-30, each holding its step and distinct weights."""
    replica, checkpoints = checkpoints_of(tmp_path)
    for step in STEPS:
        replica.step.assign(step)
        replica.model.w1.assign_add(tf.ones_like(replica.model.w1))
        checkpoints.save(step)
    return tmp_path


def restored(directory: Path, start: Path | None = None) -> tuple[str, int]:
    replica, checkpoints = checkpoints_of(directory)
    path = checkpoints.restore_newest_intact(start)
    return Path(path).name, int(replica.step.numpy())


DAMAGE = {
    "flipped-bytes": lambda d: flip_a_byte(d / "ckpt-30.data-00000-of-00001"),
    "truncated-data": lambda d: (d / "ckpt-30.data-00000-of-00001").write_bytes(
        (d / "ckpt-30.data-00000-of-00001").read_bytes()[:1000]),
    "empty-data": lambda d: (d / "ckpt-30.data-00000-of-00001").write_bytes(b""),
    "missing-shard": lambda d: (d / "ckpt-30.data-00000-of-00001").unlink(),
    "truncated-index": lambda d: (d / "ckpt-30.index").write_bytes((d / "ckpt-30.index").read_bytes()[:100]),
    "missing-index": lambda d: (d / "ckpt-30.index").unlink(),
    "flipped-index": lambda d: flip_a_byte(d / "ckpt-30.index"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_is_named_and_the_one_before_restored(run, damage, caplog):
    DAMAGE[damage](run)
    with caplog.at_level(logging.WARNING, logger="hvd_mnist"):
        assert restored(run) == ("ckpt-20", 20)
    (warning,) = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert warning.startswith(f"checkpoint {run / 'ckpt-30'} is damaged (")


@pytest.mark.parametrize("state", ["points-at-nothing", "truncated", "empty", "missing"])
def test_a_damaged_state_file_falls_back_to_the_checkpoints_on_disk(run, state, caplog):
    state_file = run / "checkpoint"
    if state == "points-at-nothing":
        state_file.write_text('model_checkpoint_path: "ckpt-90"\nall_model_checkpoint_paths: "ckpt-90"\n')
    elif state == "missing":
        state_file.unlink()
    else:
        state_file.write_text(state_file.read_text()[:25] if state == "truncated" else "")
    with caplog.at_level(logging.WARNING, logger="hvd_mnist"):
        assert restored(run) == ("ckpt-30", 30)
    if state == "points-at-nothing":
        assert any(f"{run / 'ckpt-90'} is damaged" in r.getMessage() for r in caplog.records)
    replica, checkpoints = checkpoints_of(run)
    checkpoints.restore_newest_intact()
    replica.step.assign(40)
    checkpoints.save(40)  # and the run goes on saving, with a state file that names what it writes
    assert Path(tf.train.latest_checkpoint(str(run))).name == "ckpt-40"


def test_an_uncommitted_checkpoint_is_tried_only_after_the_committed_ones(run):
    """ckpt-40's files without a commit in the state file (a crash between the two): ckpt-30 still wins."""
    replica, checkpoints = checkpoints_of(run / "other")
    replica.step.assign(40)
    checkpoints.save(40)
    for path in (run / "other").glob("ckpt-40.*"):
        path.rename(run / path.name)
    assert restored(run) == ("ckpt-30", 30)


def test_no_intact_checkpoint_is_one_line_naming_each(run):
    for step in STEPS:
        flip_a_byte(run / f"ckpt-{step}.data-00000-of-00001")
    with pytest.raises(UserError, match=r"no intact checkpoint in .*; tried ckpt-30 \(.*Checksum does not match.*\), "
                                        r"ckpt-20 \(.*\), ckpt-10 \(.*\)"):
        restored(run)


def test_a_checkpoint_of_another_model_is_refused_at_once(run):
    _, checkpoints = checkpoints_of(run, model="lenet5")
    with pytest.raises(UserError, match="ckpt-30 does not fit this model: Received incompatible tensor"):
        checkpoints.restore_newest_intact()


def test_resume_from_a_chosen_checkpoint_or_directory(run):
    assert restored(run, run / "ckpt-20") == ("ckpt-20", 20)
    other = run / "elsewhere"
    assert restored(other, run) == ("ckpt-30", 30)  # a directory: its newest intact checkpoint
    flip_a_byte(run / "ckpt-20.data-00000-of-00001")
    with pytest.raises(UserError, match="--resume-from: checkpoint .*ckpt-20 is damaged: .*Checksum does not match"):
        restored(run, run / "ckpt-20")


def test_no_checkpoint_at_all(tmp_path):
    with pytest.raises(UserError, match="--resume: no checkpoint in"):
        restored(tmp_path)


def test_a_checkpoint_of_the_tf1_optimizer_restores(tmp_path):
    """Until 2026-12-07 the replica trained with tf.compat.v1's GradientDescentOptimizer, which a checkpoint
    holds as a node without variables: such a checkpoint restores whole into the written-out SGD."""
    old, _ = checkpoints_of(tmp_path)
    old.step.assign(30)
    old.model.w1.assign_add(tf.ones_like(old.model.w1))
    legacy = tf.train.Checkpoint(**old.trackables(), optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.1))
    tf.train.CheckpointManager(legacy, str(tmp_path), max_to_keep=3).save(checkpoint_number=30)
    replica, checkpoints = checkpoints_of(tmp_path)
    assert Path(checkpoints.restore_newest_intact()).name == "ckpt-30"
    assert int(replica.step.numpy()) == 30
    for restored_var, saved in zip(replica.synced_variables, old.synced_variables, strict=True):
        tf.debugging.assert_equal(restored_var, saved)
