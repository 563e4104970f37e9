"""Elastic Horovod for Keras 3 under horovod.tensorflow.keras.elastic's names: Horovod's TensorFlowKerasState calls
`optimizer.variables()`, a list in Keras 3, and broadcasts Keras 3 variables, which Horovod 0.28 cannot."""

from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from horovod._keras.elastic import CommitStateCallbackImpl, UpdateBatchStateCallbackImpl, UpdateEpochStateCallbackImpl
from horovod.common.elastic import ObjectState
from horovod.tensorflow.elastic import run

from .ops import broadcast_variables, model_variables

__all__ = ["CommitStateCallback", "KerasState", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]


class KerasState(ObjectState):
    """A Keras 3 model's and optimizer's variables, plus `kwargs` (batch, epoch, ...) as attributes: `commit`
    keeps a copy in memory, `restore` goes back to it, `sync` makes every rank take rank 0's."""

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None, **kwargs) -> None:
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self._save_model()
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **kwargs)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for var, value in self._saved_model:
            var.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self._variables(), root_rank=0)
        self._save_model()
        super().sync()

    def _variables(self) -> list[tf.Variable]:
        return model_variables(self.model, self.optimizer)

    def _save_model(self) -> None:
        # Kept with their variables: an optimizer built after a commit has slots the commit did not see.
        self._saved_model = [(var, tf.identity(var)) for var in self._variables()]


class CommitStateCallback(CommitStateCallbackImpl, keras.callbacks.Callback):
    """Commits `state` every `batches_per_commit` batches and at each epoch's end."""

    def __init__(self, state: ObjectState, batches_per_commit: int = 1) -> None:
        super().__init__(None, state, batches_per_commit)


class UpdateBatchStateCallback(UpdateBatchStateCallbackImpl, keras.callbacks.Callback):
    """Keeps `state.batch` at the current batch (0 at an epoch's end); the first epoch after a reset is shortened."""

    def __init__(self, state: ObjectState) -> None:
        super().__init__(None, state)


class UpdateEpochStateCallback(UpdateEpochStateCallbackImpl, keras.callbacks.Callback):
    """Keeps `state.epoch` at the number of epochs done, counted across resets."""

    def __init__(self, state: ObjectState) -> None:
        super().__init__(None, state)
