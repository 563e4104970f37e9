"""Where a run starts: the newest intact checkpoint (--resume), loaded on rank 0 and shared with every rank, and
the batch plan fitted to this world."""

from __future__ import annotations

import functools
import logging

from hvd_mnist.config import TrainConfig
from hvd_mnist.errors import UserError
from hvd_mnist.runtime.supervisor import RunDir, Supervisor, World
from hvd_mnist.train.checkpointing import Checkpoints
from hvd_mnist.train.replica import Replica

log = logging.getLogger("hvd_mnist")


def restore(config: TrainConfig, world: World, supervisor: Supervisor, checkpoints: Checkpoints, replica: Replica,
            run_dir: RunDir) -> None:
    """Load the latest checkpoint on rank 0 and share it (or rank 0's initialization) with every rank."""
    with supervisor.guarded(0, "restoring"):
        if config.restores:
            restore_newest = functools.partial(checkpoints.restore_newest_intact, config.resume_from)
            log.info("resumed from %s", supervisor.on_chief(restore_newest, "restore"))
        replica.broadcast_from_chief()
    start_step = int(replica.step.numpy())
    if start_step >= config.steps:
        raise UserError(f"--resume: the checkpoint is at step {start_step}, not before --steps {config.steps}")
    previous = int(replica.global_batch.numpy())  # the checkpoint's
    plan = replica.follow(world.size)
    if previous != plan.global_batch:
        log.warning("global batch changes from %d to %d (%d rank(s) x %d x %d micro-batches) at step %d; the LR "
                    "schedule follows the new global batch", previous, plan.global_batch, world.size,
                    plan.batch_size, plan.micro_batches, start_step)
    log_plan(config, replica, run_dir)


def log_plan(config: TrainConfig, replica: Replica, run_dir: RunDir) -> None:
    log.info("model %s, %s, %d steps, output in %s", config.model, replica.plan.describe(), config.steps, run_dir)
