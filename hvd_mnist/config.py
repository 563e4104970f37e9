"""Training configuration: one dataclass with the classic script's defaults, validated up front."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from hvd_mnist.data.sources import DATASETS
from hvd_mnist.errors import UserError

MNIST_TRAIN_EXAMPLES = 60_000
MODELS = ("mlp", "lenet5")


@dataclass
class TrainConfig:
    """Everything that defines a run; defaults equal the classic multi-GPU tower script's."""

    dataset: str = "mnist"
    data_dir: Path | None = None
    train_records: list[str] = field(default_factory=list)
    test_records: list[str] = field(default_factory=list)
    model: str = "mlp"
    batch_size: int = 100
    steps: int = 1000
    lr: float = 0.001
    lr_decay: float = 0.99
    decay_examples: int = MNIST_TRAIN_EXAMPLES
    scale_lr: bool = False
    warmup_steps: int = 100
    l2: float = 1e-4
    ema_decay: float = 0.99
    seed: int = 0
    shuffle: bool = True
    output_dir: Path | None = None
    log_every: int = 100
    summary_every: int = 100
    histogram_every: int = 500
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    eval_batch_size: int = 1000
    resume: bool = False
    overwrite: bool = False
    mixed_precision: bool = False
    loss_scale: float = 128.0
    fp16_allreduce: bool = False
    bind_cpus: bool = True
    elastic: bool = False
    commit_every: int = 10

    def validate(self) -> None:
        """Raise UserError naming the first flag that makes no sense."""
        positive = ("batch_size", "steps", "decay_examples", "log_every", "summary_every",
                    "histogram_every", "checkpoint_every", "keep_checkpoints", "eval_batch_size", "commit_every")
        for name in positive:
            if getattr(self, name) <= 0:
                raise UserError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.lr <= 0:
            raise UserError(f"--lr must be positive, got {self.lr}")
        for name in ("lr_decay", "ema_decay"):
            if not 0 < getattr(self, name) <= 1:
                raise UserError(f"--{name.replace('_', '-')} must be in (0, 1], got {getattr(self, name)}")
        if self.loss_scale <= 0:
            raise UserError(f"--loss-scale must be positive, got {self.loss_scale}")
        if self.l2 < 0 or self.warmup_steps < 0:
            raise UserError("--l2 and --warmup-steps must not be negative")
        if self.model not in MODELS:
            raise UserError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        if self.dataset not in DATASETS:
            raise UserError(f"unknown dataset {self.dataset!r}; choose one of {', '.join(DATASETS)}")
        if self.resume and self.output_dir is None:
            raise UserError("--resume needs --output-dir naming the run to continue")
        if self.elastic and self.output_dir is None:
            raise UserError("--elastic needs --output-dir: workers that join later must find the same run")
        if self.resume and self.overwrite:
            raise UserError("--resume and --overwrite contradict each other")

    def decay_steps(self, world_size: int) -> float:
        """LR decays by lr_decay once per `decay_examples / global batch` steps."""
        return self.decay_examples / (self.batch_size * world_size)

    def to_json(self) -> str:
        """The configuration as JSON (paths as strings)."""
        return json.dumps(dataclasses.asdict(self), default=str, indent=2, sort_keys=True)
