"""The batch plan: how a world of N ranks trains, as one pure value that everything else reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hvd_mnist.config import TrainConfig, flag
from hvd_mnist.errors import UserError

if TYPE_CHECKING:  # a plain value the Supervisor hands over; importing it for real would load Horovod
    from hvd_mnist.runtime.supervisor import Limit

# Bytes a step holds per activation float: float32 values, their gradients, and one temporary of each.
BYTES_PER_ACTIVATION = 3 * 4


def size(nbytes: int) -> str:
    """'411 MiB' or '58.0 GiB': a memory size as a person reads it."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


@dataclass(frozen=True)
class BatchPlan:
    """Per-rank batch, micro-batches per update, the global batch, the LR decay period and LR scale of one world.

    The replica's variables are set from it, and the loop and its log lines read it; nothing else computes a
    global batch.
    """

    world_size: int
    batch_size: int
    micro_batches: int
    decay_steps: float
    lr_scale: float

    @classmethod
    def of(cls, config: TrainConfig, world_size: int, target_global_batch: int = 0) -> BatchPlan:
        """The plan for `world_size` ranks; with --keep-global-batch and a target (the first start's global batch),
        the micro-batches that come nearest to it."""
        micro_batches = config.accumulate
        if config.keep_global_batch and target_global_batch:
            micro_batches = max(1, round(target_global_batch / (config.batch_size * world_size)))
        global_batch = config.batch_size * world_size * micro_batches
        return cls(world_size, config.batch_size, micro_batches, config.decay_examples / global_batch,
                   float(world_size) if config.scale_lr else 1.0)

    @property
    def global_batch(self) -> int:
        """Examples per update over all ranks: batch size x ranks x micro-batches."""
        return self.batch_size * self.world_size * self.micro_batches

    @property
    def across_ranks(self) -> bool:
        """Whether a collective is needed: on one rank an average or a sum is the value itself, and skipping it
        saves a round trip through Horovod's background thread."""
        return self.world_size > 1

    def check_fits(self, train_examples: int, activations_per_example: int, rank: int, memory: Limit) -> None:
        """UserError, naming the sizes, for a batch that one rank's shard cannot fill (the input pipeline would
        look for it forever) or whose step cannot fit in what is left under `rank`'s tightest memory limit (the
        line names it: a container's cgroup, an rlimit, or the machine's available memory)."""
        per_step = self.batch_size * self.micro_batches
        shard = train_examples // self.world_size
        what = flag("batch_size") + f" {self.batch_size}"
        if self.micro_batches > 1:
            what += f" x {flag('accumulate')} {self.micro_batches} = {per_step} examples a step"
        if per_step > shard:
            raise UserError(f"{what} is more than a rank's share of the training data: {shard} examples "
                            f"({train_examples} over {self.world_size} rank(s))")
        need = self.batch_size * activations_per_example * BYTES_PER_ACTIVATION
        if need > memory.headroom:
            raise UserError(f"{flag('batch_size')} {self.batch_size} needs about {size(need)} for one step's "
                            f"activations; rank {rank} has {size(memory.headroom)} left, at {memory.describe()}")

    def describe(self) -> str:
        accumulation = f" x {self.micro_batches} micro-batches" if self.micro_batches > 1 else ""
        return f"batch {self.batch_size} per rank{accumulation} (global {self.global_batch})"
