"""DistributedOptimizer for Keras 3: the gradients averaged over the ranks inside `apply`, which `fit`'s compiled
step calls (Keras 2's `get_gradients` and `_aggregate_gradients`, which Horovod hooks, are never called)."""

from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.ops import control_flow_util

_DISTRIBUTED: dict[type, type] = {}  # optimizer class -> its distributed subclass, made once


class _Averaging:
    """Mixed into the wrapped optimizer's class: `apply` first averages the gradients over the ranks."""

    _hvd_compression = hvd.Compression.none
    _hvd_op = hvd.Average
    _hvd_sparse_as_dense = False

    def apply(self, grads, trainable_variables=None):
        if control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()):
            raise ValueError("hvd_mnist.keras: XLA cannot compile Horovod's allreduce: compile the model with "
                             "jit_compile=False ('auto' turns XLA on where a GPU is found)")
        return super().apply(self._averaged(list(grads)), trainable_variables)

    def _averaged(self, grads: list) -> list:
        """All gradients in one grouped allreduce (one negotiation, fused); None stays None."""
        if hvd.size() == 1:
            return grads
        present = [i for i, grad in enumerate(grads) if grad is not None]
        tensors = [grads[i] for i in present]
        if self._hvd_sparse_as_dense:
            tensors = [tf.convert_to_tensor(grad) for grad in tensors]
        reduced = hvd.grouped_allreduce(tensors, op=self._hvd_op, compression=self._hvd_compression)
        for i, grad in zip(present, reduced, strict=True):
            grads[i] = grad
        return grads


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None,
                         compression=hvd.Compression.none, sparse_as_dense: bool = False, op=hvd.Average,
                         backward_passes_per_step: int = 1, **ignored_devices) -> keras.optimizers.Optimizer:
    """`optimizer` (any Keras 3 optimizer, built or not) made to average gradients over the ranks, and returned.

    The object itself changes class (to a subclass of its own class with the same name), so its state, its
    learning-rate schedule and whatever already refers to it stay; wrapping twice averages once.
    `compression=Compression.fp16` halves what the allreduce carries; `op=Sum` sums instead of averaging.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"hvd_mnist.keras.DistributedOptimizer wraps a Keras 3 optimizer, not {type(optimizer)!r}")
    if op not in (hvd.Average, hvd.Sum):
        raise ValueError("hvd_mnist.keras.DistributedOptimizer: op must be Average or Sum")
    if backward_passes_per_step != 1:
        raise ValueError("hvd_mnist.keras.DistributedOptimizer: backward_passes_per_step > 1 is not supported; "
                         "use the optimizer's own gradient_accumulation_steps")
    unknown = set(ignored_devices) - {"device_dense", "device_sparse"}
    if unknown:
        raise TypeError(f"hvd_mnist.keras.DistributedOptimizer got unexpected arguments: {', '.join(sorted(unknown))}")
    base = type(optimizer)
    if not issubclass(base, _Averaging):
        if base not in _DISTRIBUTED:
            _DISTRIBUTED[base] = type(base.__name__, (_Averaging, base), {"__module__": base.__module__,
                                                                         "__qualname__": base.__qualname__})
        optimizer.__class__ = _DISTRIBUTED[base]
    optimizer._hvd_compression, optimizer._hvd_op = compression, op
    optimizer._hvd_sparse_as_dense = sparse_as_dense
    if name is not None:
        optimizer.name = name
    return optimizer
