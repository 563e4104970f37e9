"""The batch plan: how a world of N ranks trains, as one pure value that everything else reads."""

from __future__ import annotations

from dataclasses import dataclass

from hvd_mnist.config import TrainConfig


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

    def describe(self) -> str:
        accumulation = f" x {self.micro_batches} micro-batches" if self.micro_batches > 1 else ""
        return f"batch {self.batch_size} per rank{accumulation} (global {self.global_batch})"
