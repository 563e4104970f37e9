"""Horovod's collectives on Keras 3 values: variables handed over as their tf.Variable, broadcasts named by
position (Horovod matches collectives by name, and a model loaded on one rank names its variables differently
from the same model built on another)."""

from __future__ import annotations

from collections.abc import Iterable

import horovod.tensorflow as hvd
import keras
import tensorflow as tf


def tensor_of(value) -> tf.Tensor | tf.Variable:
    """A Keras 3 variable as its tf.Variable (Horovod 0.28 predates Keras 3), anything else as a tensor."""
    if isinstance(value, keras.Variable):
        return value.value
    return value if isinstance(value, tf.Variable) else tf.convert_to_tensor(value)


def model_variables(model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None,
                    skip: Iterable = ()) -> list[tf.Variable]:
    """The model's and its optimizer's variables, less `skip`, as tf.Variables. An optimizer not yet built is
    built on the model's trainable variables first, so its slots exist (and match) on every rank."""
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    owned = [*model.variables, *(optimizer.variables if optimizer is not None else [])]
    skipped = {id(tensor_of(v)) for v in skip}
    return [tensor_of(v) for v in owned if id(tensor_of(v)) not in skipped]


def broadcast_variables(variables: Iterable, root_rank: int = 0) -> None:
    """Assign `root_rank`'s values to these variables on every rank. Every rank must pass the same number of
    variables, of the same shapes and types, in the same order: a rank that does not is refused in one line."""
    variables = [tensor_of(v) for v in variables]
    layout = [(tuple(v.shape), v.dtype.name) for v in variables]
    layouts = hvd.allgather_object(layout, name="hvd_mnist_keras_layout")
    for other, theirs in enumerate(layouts):
        if theirs != layout:
            raise ValueError(f"hvd_mnist.keras: rank {hvd.rank()} and rank {other} hold different variables "
                             f"({len(layout)} against {len(theirs)}, or other shapes): build the same model and "
                             f"optimizer on every rank")
    if variables:
        _broadcast_group(variables, root_rank)


@tf.function(autograph=False, reduce_retracing=True)
def _broadcast_group(variables: list[tf.Variable], root_rank: int) -> None:
    for position, var in enumerate(variables):
        var.assign(hvd.broadcast(var, root_rank, name=f"hvd_mnist_keras_broadcast.{position}"))


def average_variables(variables: Iterable) -> None:
    """Assign each variable the average of its values over the ranks, in one grouped allreduce: the state that
    every rank updates from its own data alone (BatchNormalization's moving statistics) made equal again."""
    variables = [tensor_of(v) for v in variables]
    if variables and hvd.size() > 1:
        _average_group(variables)


@tf.function(autograph=False, reduce_retracing=True)
def _average_group(variables: list[tf.Variable]) -> None:
    averages = hvd.grouped_allreduce([var.read_value() for var in variables], op=hvd.Average,
                                     name="hvd_mnist_keras_average")
    for var, average in zip(variables, averages, strict=True):
        var.assign(average)
