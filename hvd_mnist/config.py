"""Training configuration: one dataclass of plain values, validated up front."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from hvd_mnist.data.sources import DATASETS
from hvd_mnist.errors import UserError
from hvd_mnist.model_registry import MODELS  # the built-in ones; --model MODULE:FUNCTION names a user's

MNIST_TRAIN_EXAMPLES = 60_000
USER_MODEL = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
EXPORTS = ("final", "best", "none")
# Where the defaults differ from the classic multi-GPU tower script (`--classic` restores these): its LR was
# tuned for raw 0..255 pixels, and with pixels in [0, 1] it learns slowly (71% test accuracy after 1000 steps).
CLASSIC = {"lr": 0.001}
MLFLOW_LOCAL_STORE = "./mlruns"  # --mlflow without a URI: a local file store, as MLflow's own default once was
# The largest number any setting takes: counts become int32/int64 tensors and seconds become thread timeouts,
# and a value past this is a typo, not an experiment.
MAX_NUMBER = 2**31 - 1
MAX_COLLECTIVE_TIMEOUT_S = 86_400  # a day; Gloo's own timeout (this + a margin) is held in int milliseconds
MAX_LOSS_SCALE = 2.0**24  # the loss times this must stay finite in float16 for any loss a step can have


@dataclass
class TrainConfig:
    """Everything that defines a run; the classic script's values except where CLASSIC says otherwise."""

    dataset: str = "mnist"
    data_dir: Path | None = None
    train_records: list[str] = field(default_factory=list)
    test_records: list[str] = field(default_factory=list)
    validation_size: int | None = None
    model: str = "mlp"
    batch_size: int = 100
    accumulate: int = 1
    steps: int = 1000
    lr: float = 0.1
    lr_decay: float = 0.99
    decay_examples: int = MNIST_TRAIN_EXAMPLES
    scale_lr: bool = False
    warmup_steps: int = 100
    l2: float = 1e-4
    ema_decay: float = 0.99
    seed: int = 0
    shuffle: bool = True
    eval_every: int = 0
    target_accuracy: float | None = None
    keep_best: bool = False
    output_dir: Path | None = None
    log_every: int = 100
    summary_every: int = 100
    histogram_every: int = 500
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    export: str = "final"
    metrics_port: int | None = None
    metrics_address: str = "0.0.0.0"  # every interface, as Prometheus exporters listen by convention
    mlflow: str | None = None
    eval_batch_size: int = 1000
    resume: bool = False
    resume_from: Path | None = None
    overwrite: bool = False
    mixed_precision: bool = False
    loss_scale: float = 128.0
    fp16_allreduce: bool = False
    bind_cpus: bool = True
    collective_timeout: float = 120.0
    horovod_timeline: bool = False
    elastic: bool = False
    commit_every: int = 10
    keep_global_batch: bool = False

    def validate(self) -> None:
        """Raise UserError naming the first flag that makes no sense."""
        for name, value in self._numbers():
            if not math.isfinite(value):  # NaN passes every `<= 0` test: it must be caught by name
                raise UserError(f"{flag(name)} must be a finite number, got {value}")
            if abs(value) > MAX_NUMBER:
                raise UserError(f"{flag(name)} is out of range: {value} (at most {MAX_NUMBER})")
        positive = ("batch_size", "accumulate", "steps", "decay_examples", "log_every", "summary_every",
                    "histogram_every", "checkpoint_every", "keep_checkpoints", "eval_batch_size", "commit_every")
        for name in positive:
            if getattr(self, name) <= 0:
                raise UserError(f"{flag(name)} must be positive, got {getattr(self, name)}")
        if self.lr <= 0:
            raise UserError(f"--lr must be positive, got {self.lr}")
        for name in ("lr_decay", "ema_decay"):
            if not 0 < getattr(self, name) <= 1:
                raise UserError(f"{flag(name)} must be in (0, 1], got {getattr(self, name)}")
        if not 0 < self.loss_scale <= MAX_LOSS_SCALE:
            raise UserError(f"--loss-scale must be in (0, {MAX_LOSS_SCALE:.0f}], got {self.loss_scale}")
        for name in ("l2", "warmup_steps", "eval_every", "collective_timeout", "seed"):
            if getattr(self, name) < 0:
                raise UserError(f"{flag(name)} must not be negative, got {getattr(self, name)}")
        if self.collective_timeout > MAX_COLLECTIVE_TIMEOUT_S:
            raise UserError(f"--collective-timeout must be at most {MAX_COLLECTIVE_TIMEOUT_S} s (a day; 0 turns it "
                            f"off), got {self.collective_timeout}")
        try:
            ipaddress.ip_address(self.metrics_address)
        except ValueError:
            raise UserError(f"--metrics-address must be an IP address (0.0.0.0: every interface; 127.0.0.1: this "
                            f"host only), got {self.metrics_address!r}") from None
        if self.mlflow is not None and not self.mlflow.strip():
            raise UserError("--mlflow must not be empty (give a tracking URI, or the flag alone for a local store)")
        for name in ("train_records", "test_records"):
            if any(not str(pattern).strip() for pattern in getattr(self, name)):
                raise UserError(f"{flag(name)} must not name an empty file")
        if self.validation_size is not None and self.validation_size <= 0:
            raise UserError(f"--validation-size must be positive, got {self.validation_size}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise UserError(f"--target-accuracy must be in (0, 1], got {self.target_accuracy}")
        if (self.target_accuracy is not None or self.keep_best) and not self.eval_every:
            raise UserError("--target-accuracy and --keep-best need --eval-every N (how often to evaluate)")
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536:
            raise UserError(f"--metrics-port must be a port number (1-65535), got {self.metrics_port}")
        if self.export not in EXPORTS:
            raise UserError(f"unknown --export {self.export!r}; choose one of {', '.join(EXPORTS)}")
        if self.export == "best" and not self.keep_best:
            raise UserError("--export best needs --keep-best")
        if self.model not in MODELS and not USER_MODEL.fullmatch(self.model):
            raise UserError(f"unknown --model {self.model!r}; choose one of {', '.join(MODELS)}, or name a function "
                            "of yours as MODULE:FUNCTION")
        if self.mixed_precision and self.model not in MODELS:
            raise UserError("--mixed-precision is for the built-in models; a model of yours sets its own dtypes")
        if self.dataset not in DATASETS:
            raise UserError(f"unknown --dataset {self.dataset!r}; choose one of {', '.join(DATASETS)}")
        if self.resume and self.output_dir is None:
            raise UserError("--resume needs --output-dir naming the run to continue")
        if self.elastic and self.output_dir is None:
            raise UserError("--elastic needs --output-dir: workers that join later must find the same run")
        if self.keep_global_batch and not self.elastic:
            raise UserError("--keep-global-batch is for --elastic runs, whose number of ranks changes")
        if (self.resume or self.resume_from) and self.overwrite:
            raise UserError("--resume/--resume-from and --overwrite contradict each other")

    def _numbers(self) -> list[tuple[str, int | float]]:
        """Every numeric setting that has a value (bools are flags, not numbers)."""
        values = ((item.name, getattr(self, item.name)) for item in dataclasses.fields(self))
        return [(name, value) for name, value in values
                if isinstance(value, int | float) and not isinstance(value, bool)]

    @property
    def restores(self) -> bool:
        """Whether the run starts from a checkpoint (--resume, --resume-from) instead of a fresh initialization."""
        return self.resume or self.resume_from is not None

    @property
    def evaluates(self) -> bool:
        """Whether the run evaluates during training, and so holds a validation split out of the training data."""
        return self.eval_every > 0


def flag(name: str) -> str:
    """The command-line flag of a TrainConfig field."""
    return "--" + name.replace("_", "-")
