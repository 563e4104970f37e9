"""Keras 3 callbacks under horovod.tensorflow.keras.callbacks' names: start equal, log equal, warm up the LR."""

from __future__ import annotations

from collections.abc import Callable

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from .ops import average_variables, broadcast_variables, model_variables, tensor_of


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Every rank starts each `fit` from `root_rank`'s weights and optimizer state (slots, step count).

    Runs at the start of training, after Keras has built the optimizer's slots and after whatever the script
    restored before `fit`; so a restore on one rank (or on all) continues on every rank. `local_variables`
    (Keras or tf variables) keep each rank's own values, for layers that differ between ranks by design.

    At each epoch's end (before the callbacks listed after it, a checkpoint's among them) BatchNormalization's
    moving mean and variance, which each rank updates from its own shard, are averaged over the ranks, so every
    rank ends each epoch with the same state.
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: list | None = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.local_variables = list(local_variables or [])

    def on_train_begin(self, logs: dict | None = None) -> None:
        if hvd.size() > 1:
            broadcast_variables(model_variables(self.model, skip=self.local_variables), root_rank=self.root_rank)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Only BatchNormalization's own statistics: a frozen layer's weights are equal on every rank already, and
        SyncBatchNormalization's statistics are those of the global batch."""
        skipped = {id(tensor_of(v)) for v in self.local_variables}
        average_variables([v for layer in self.model._flatten_layers(include_self=False)
                           if type(layer) is keras.layers.BatchNormalization
                           for v in (layer.moving_mean, layer.moving_variance) if id(tensor_of(v)) not in skipped])


class MetricAverageCallback(keras.callbacks.Callback):
    """The epoch's logs (loss, metrics, validation) averaged over the ranks in one allreduce, so every rank
    logs and decides (early stopping, the best checkpoint, ReduceLROnPlateau) on the same numbers.

    List it before the callbacks that read the logs.
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is None or hvd.size() == 1:
            return
        names = sorted(name for name, value in logs.items() if np.isscalar(value) or np.ndim(value) == 0)
        means = hvd.allreduce(tf.constant([float(logs[name]) for name in names], tf.float64), op=hvd.Average,
                              name=f"metric_average_{epoch}")
        logs.update(zip(names, means.numpy().tolist(), strict=True))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """The LR is `initial_lr * multiplier` from `start_epoch` up to `end_epoch` (exclusive); `multiplier` is a
    number or a function of the epoch, evaluated each epoch (staircase) or each batch at fractional epochs."""

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float], start_epoch: int = 0,
                 end_epoch: int | None = None, staircase: bool = True, momentum_correction: bool = False,
                 steps_per_epoch: int | None = None) -> None:
        super().__init__()
        self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.epoch = 0
        if momentum_correction:
            # Keras 3 traces an optimizer's momentum into its compiled step as a constant: it cannot follow the LR.
            raise ValueError("hvd_mnist.keras: momentum_correction=True cannot be done with Keras 3 optimizers "
                             "(their momentum is compiled in as a constant); pass momentum_correction=False")

    def _adjust(self, epoch: float) -> None:
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        optimizer = self.model.optimizer
        if not isinstance(optimizer.learning_rate, keras.Variable | tf.Variable):
            raise ValueError("hvd_mnist.keras: a learning-rate callback needs an optimizer made with a number as its "
                             "learning_rate, not a LearningRateSchedule")
        optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch
        if self.staircase:
            self._adjust(epoch)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if not self.staircase:
            steps = self.steps_per_epoch or self.params.get("steps")
            if not steps:
                raise ValueError("hvd_mnist.keras: pass steps_per_epoch (fit did not say how many steps an epoch has)")
            self._adjust(self.epoch + batch / steps)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warm-up (Goyal et al., 2017): from `initial_lr / size` to `initial_lr` over `warmup_epochs`, batch
    by batch, where `initial_lr` is already scaled by the number of ranks."""

    def __init__(self, initial_lr: float, warmup_epochs: float = 5, momentum_correction: bool = False,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        size = hvd.size()
        super().__init__(initial_lr, lambda epoch: (epoch * (size - 1) / warmup_epochs + 1) / size, start_epoch=0,
                         end_epoch=warmup_epochs, staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if epoch == int(np.ceil(self.end_epoch)) - 1 and self.verbose and hvd.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished the learning-rate warm-up to {self.initial_lr:g}.")
