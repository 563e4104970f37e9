"""Horovod for Keras 3's `model.fit`, under the names of `horovod.tensorflow.keras`, averaging for real.

Horovod 0.28's Keras layer was written for Keras 2: with Keras 3 (TensorFlow 2.16+) its DistributedOptimizer
hooks methods that `fit` no longer calls, so each rank silently applies its own gradient, and its broadcasts
fail on Keras 3 variables. A Horovod Keras script ports by one import:

    import hvd_mnist.keras as hvd      # instead of: import horovod.tensorflow.keras as hvd

This package imports only TensorFlow, Keras, Horovod and NumPy (nothing else of hvd_mnist).
"""

from __future__ import annotations

import horovod.tensorflow as _hvd
import keras
import tensorflow as tf
from horovod.tensorflow import (
    Average,
    Compression,
    ProcessSet,
    Sum,
    add_process_set,
    allgather_object,
    broadcast_object,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)

from . import callbacks, elastic
from .ops import broadcast_variables, tensor_of
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer
from .sync_batch_norm import SyncBatchNormalization

__all__ = [
    "Average",
    "Compression",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "ProcessSet",
    "Sum",
    "SyncBatchNormalization",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]


def allreduce(value, name: str | None = None, op=Average, compression=Compression.none,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """`value` (a tensor, a number, an array or a Keras variable) reduced over the ranks; the average by default."""
    return _hvd.allreduce(tensor_of(value), name=name, op=op, compression=compression,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def allgather(value, name: str | None = None) -> tf.Tensor:
    """Every rank's `value` concatenated along the first axis, in rank order."""
    return _hvd.allgather(tensor_of(value), name=name)


def broadcast(value, root_rank: int, name: str | None = None) -> tf.Tensor:
    """`root_rank`'s `value` on every rank."""
    return _hvd.broadcast(tensor_of(value), root_rank, name=name)


def reducescatter(value, name: str | None = None, op=Average) -> tf.Tensor:
    """`value` reduced over the ranks and split along the first axis, this rank keeping its part."""
    return _hvd.reducescatter(tensor_of(value), name=name, op=op)


def broadcast_global_variables(root_rank: int) -> None:
    """Keras 3 keeps no global collection of variables: refused, naming what to use instead."""
    raise NotImplementedError("broadcast_global_variables: Keras 3 has no global variables; use "
                              "callbacks.BroadcastGlobalVariablesCallback(0) in fit, or "
                              "broadcast_variables(model.variables + model.optimizer.variables)")


def load_model(filepath: str, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts: bool = False, **kwargs) -> keras.Model:
    """`keras.models.load_model`, with the saved optimizer wrapped in DistributedOptimizer again."""
    if legacy_opts:
        raise ValueError("hvd_mnist.keras.load_model: legacy (Keras 2) optimizers do not exist in Keras 3")
    objects = {**(custom_objects or {}), **{cls.__name__: cls for cls in custom_optimizers or ()}}
    model = keras.models.load_model(filepath, custom_objects=objects, **kwargs)
    if getattr(model, "optimizer", None) is not None:
        DistributedOptimizer(model.optimizer, compression=compression)
    return model
