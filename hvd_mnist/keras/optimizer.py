"""DistributedOptimizer for Keras 3: the gradients averaged over the ranks inside `apply`, which `fit`'s compiled
step calls (Keras 2's `get_gradients` and `_aggregate_gradients`, which Horovod hooks, are never called).

Horovod's options mean what they meant with Keras 2: `backward_passes_per_step=N` sums gradients locally and
allreduces and applies them once every N calls (the others only count `iterations`), `sparse_as_dense` turns
IndexedSlices dense before the allreduce, `groups` splits the allreduce, and the gradients of variables registered
as local (`register_local_var`, `PartialDistributedOptimizer`) are not reduced but divided by the number of ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.ops import control_flow_util

from .ops import tensor_of


def _key(var) -> object:
    """One hashable key per variable, whether given as a Keras 3 variable or as its tf.Variable."""
    if not isinstance(var, keras.Variable | tf.Variable):
        raise ValueError(f"hvd_mnist.keras: expected a variable, got {type(var)!r}")
    return tensor_of(var).ref()


@dataclass(frozen=True)
class _Settings:
    """What one DistributedOptimizer call asked for; a class attribute, so `from_config` copies keep it."""

    compression: type = hvd.Compression.none
    op: int = hvd.Average
    sparse_as_dense: bool = False
    predivide: float = 1.0
    passes: int = 1
    average_aggregated: bool = False
    groups: int | list | None = None
    process_set: hvd.ProcessSet = hvd.global_process_set
    scale_local: bool = True
    devices: tuple[str, str] = ("", "")


class _Aggregation:
    """Horovod's `_agg_helper` for Keras 3: each pass's gradients summed into local variables, allreduced on the
    `passes`-th pass; `counter` says how many passes the sums hold (0 right after an allreduce)."""

    def __init__(self, passes: int, average: bool) -> None:
        self.passes, self.average = passes, average
        with tf.init_scope():
            self.counter = tf.Variable(0, trainable=False, dtype=tf.int32, name="hvd_aggregation_counter")
        self.sums: dict[object, tf.Variable] = {}

    def add(self, grads: list, variables: Sequence) -> list:
        """Adds this pass's gradients to the sums and counts the pass; returns the sums (None stays None)."""
        sums = []
        for grad, var in zip(grads, variables, strict=True):
            if grad is None:
                sums.append(None)
                continue
            if isinstance(grad, tf.IndexedSlices):
                raise ValueError("hvd_mnist.keras: backward_passes_per_step > 1 sums gradients densely: pass "
                                 "sparse_as_dense=True for a model with sparse gradients (an Embedding)")
            if _key(var) not in self.sums:
                with tf.init_scope():  # made once, outside whatever tf.function is tracing
                    self.sums[_key(var)] = tf.Variable(tf.zeros(var.shape, grad.dtype), trainable=False)
            self.sums[_key(var)].assign_add(grad)
            sums.append(self.sums[_key(var)].read_value())
        self.counter.assign_add(1)
        return sums

    def clear(self) -> None:
        self.counter.assign(0)
        for total in self.sums.values():
            total.assign(tf.zeros_like(total))


@dataclass
class _State:
    """Per optimizer object: the aggregation, the local variables, gradients that compute_gradients reduced."""

    aggregation: _Aggregation | None
    local: set = field(default_factory=set)
    reduced: list | None = None


class _Distributed:
    """Mixed into the wrapped optimizer's class: gradients reduced over the ranks before they are applied."""

    _hvd_settings = _Settings()

    def __init__(self, *args, **kwargs) -> None:  # a copy made by from_config is distributed too
        super().__init__(*args, **kwargs)
        self._hvd_start()

    def _hvd_start(self, local: set | None = None) -> None:
        settings = self._hvd_settings
        aggregation = _Aggregation(settings.passes, settings.average_aggregated) if settings.passes > 1 else None
        self._hvd_state = _State(aggregation, set(local or ()))

    @property
    def _agg_helper(self) -> _Aggregation | None:
        return self._hvd_state.aggregation

    def register_local_var(self, var) -> None:
        """This variable's gradient stays this rank's own (divided by the number of ranks, as Horovod does)."""
        self._hvd_state.local.add(_key(var))

    def apply(self, grads, trainable_variables=None):
        """What `fit` and `apply_gradients` call: the gradients reduced (unless compute_gradients reduced them
        since the last apply: then they are applied as given, clipped or cast by the script or not, as Horovod's
        Keras 2 layer did), then applied, or with backward_passes_per_step only on every N-th call."""
        grads = list(grads)
        if trainable_variables is None and not self.built:
            return super().apply(grads)  # Keras refuses this, in its own words
        variables = list(self._trainable_variables if trainable_variables is None else trainable_variables)
        reduced, self._hvd_state.reduced = self._hvd_state.reduced, None
        if reduced is None:
            grads = self._hvd_reduce(grads, variables)
        aggregation = self._hvd_state.aggregation
        if aggregation is None:
            return super().apply(grads, variables)
        if not self.built:  # before tf.cond: a branch may not create the slots
            self.build(variables)
            self.built = True
        outer = super()

        def apply_now() -> None:
            outer.apply(grads, variables)

        def count_only() -> None:  # as Horovod did: `iterations` counts passes, applied or not
            self.iterations.assign_add(1)

        tf.cond(tf.equal(aggregation.counter, 0), apply_now, count_only)

    def compute_gradients(self, loss, var_list, tape: tf.GradientTape | None = None) -> list[tuple]:
        """Horovod's Keras 2 method: `(gradient, variable)` pairs, the gradients already reduced over the ranks
        (or, with backward_passes_per_step, summed so far); apply_gradients applies these very tensors as they
        are. `loss` is a tensor recorded on `tape`, or a function of no arguments."""
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape: tf.GradientTape | None = None) -> list[tuple]:
        tape = tf.GradientTape() if tape is None else tape
        if callable(loss):
            with tape:
                if not callable(var_list):
                    tape.watch([tensor_of(v) for v in var_list])
                loss = loss()
        variables = list(var_list() if callable(var_list) else var_list)
        reduced = self._hvd_reduce(list(tape.gradient(loss, variables, output_gradients=grad_loss)), variables)
        self._hvd_state.reduced = reduced
        return list(zip(reduced, variables, strict=True))

    def _hvd_reduce(self, grads: list, variables: list) -> list:
        if control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()):
            raise ValueError("hvd_mnist.keras: XLA cannot compile Horovod's allreduce: compile the model with "
                             "jit_compile=False ('auto' turns XLA on where a GPU is found)")
        if self._hvd_settings.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        aggregation = self._hvd_state.aggregation
        if aggregation is None:
            return self._hvd_allreduce(grads, variables)
        sums = aggregation.add(grads, variables)
        present = [i for i, total in enumerate(sums) if total is not None]

        def allreduce_and_clear() -> list:
            reduced = self._hvd_allreduce([sums[i] for i in present], [variables[i] for i in present])
            if aggregation.average:
                reduced = [grad / aggregation.passes for grad in reduced]
            aggregation.clear()
            return reduced

        chosen = tf.cond(tf.equal(aggregation.counter, aggregation.passes), allreduce_and_clear,
                         lambda: [tf.identity(sums[i]) for i in present])
        for i, grad in zip(present, chosen, strict=True):
            sums[i] = grad
        return sums

    def _hvd_allreduce(self, grads: list, variables: list) -> list:
        """Shared gradients reduced in grouped allreduces (one negotiation each, fused), local ones scaled."""
        settings, local = self._hvd_settings, self._hvd_state.local
        size = settings.process_set.size()
        shared = [i for i, g in enumerate(grads) if g is not None and _key(variables[i]) not in local]
        grads = list(grads)
        if size > 1:
            prescale, postscale = ((1.0 / settings.predivide, settings.predivide) if settings.op == hvd.Average
                                   else (1.0, 1.0))
            for group in _groups(settings.groups, shared, variables):
                reduced = hvd.grouped_allreduce(
                    [grads[i] for i in group], op=settings.op, compression=settings.compression,
                    prescale_factor=prescale, postscale_factor=postscale, process_set=settings.process_set,
                    device_dense=settings.devices[0], device_sparse=settings.devices[1])
                for i, grad in zip(group, reduced, strict=True):
                    grads[i] = grad
        if settings.scale_local and local:
            for i, grad in enumerate(grads):
                if grad is not None and _key(variables[i]) in local:
                    grads[i] = (tf.IndexedSlices(grad.values / size, grad.indices, grad.dense_shape)
                                if isinstance(grad, tf.IndexedSlices) else grad / size)
        return grads


def _groups(groups: int | list | None, indices: list[int], variables: list) -> list[list[int]]:
    """The allreduce groups, as positions: all in one (None), `groups` near-equal runs (int, as Horovod splits),
    or the given lists of variables, each variable in none of them alone."""
    if groups is None:
        return [indices] if indices else []
    if isinstance(groups, int):
        d, r = divmod(len(indices), groups)
        runs = [indices[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(groups)]
        return [run for run in runs if run]
    position = {_key(variables[i]): i for i in indices}
    listed = [[position.pop(_key(v)) for v in group if _key(v) in position] for group in groups]
    return [group for group in listed if group] + [[i] for i in position.values()]


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None, device_dense: str = "",
                         device_sparse: str = "", compression=hvd.Compression.none, sparse_as_dense: bool = False,
                         gradient_predivide_factor: float = 1.0, op=hvd.Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: int | list | None = None, process_set: hvd.ProcessSet = hvd.global_process_set,
                         scale_local_gradients: bool = True) -> keras.optimizers.Optimizer:
    """`optimizer` (any Keras 3 optimizer, built or not) made to reduce gradients over the ranks, and returned.

    The object itself changes class (to a subclass of its own class with the same name, so a saved model loads
    without Horovod), so its state, its learning-rate schedule and whatever already refers to it stay; wrapping
    again replaces the settings. The arguments are Horovod's, with their meanings (see the module's docstring).
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"hvd_mnist.keras.DistributedOptimizer wraps a Keras 3 optimizer, not {type(optimizer)!r}")
    if op not in (hvd.Average, hvd.Sum):
        raise ValueError("hvd_mnist.keras.DistributedOptimizer: op must be Average or Sum")
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("hvd_mnist.keras.DistributedOptimizer: gradient_predivide_factor needs op=Average")
    if backward_passes_per_step < 1:
        raise ValueError("hvd_mnist.keras.DistributedOptimizer: backward_passes_per_step must be at least 1")
    groups = groups if groups is not None or not num_groups else num_groups
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("hvd_mnist.keras.DistributedOptimizer: groups is a positive int or a list of lists of "
                         "variables")
    base = type(optimizer)
    while issubclass(base, _Distributed):
        base = base.__bases__[1]
    settings = _Settings(compression, op, sparse_as_dense, gradient_predivide_factor, backward_passes_per_step,
                         average_aggregated_gradients, groups, process_set, scale_local_gradients,
                         (device_dense, device_sparse))
    local = optimizer._hvd_state.local if isinstance(optimizer, _Distributed) else None
    optimizer.__class__ = type(base.__name__, (_Distributed, base), {
        "__module__": base.__module__, "__qualname__": base.__qualname__, "_hvd_settings": settings})
    optimizer._hvd_start(local)
    if name is not None:
        optimizer.name = name
    return optimizer


def PartialDistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None,
                                local_layers: keras.layers.Layer | Sequence[keras.layers.Layer] | None = None,
                                **kwargs) -> keras.optimizers.Optimizer:
    """DistributedOptimizer that leaves the gradients of `local_layers`' trainable weights to each rank (layers
    that differ between ranks by design); the other arguments are DistributedOptimizer's."""
    layers = [local_layers] if isinstance(local_layers, keras.layers.Layer) else list(local_layers or [])
    if not all(isinstance(layer, keras.layers.Layer) for layer in layers):
        raise ValueError("hvd_mnist.keras.PartialDistributedOptimizer: local_layers must be Keras layers")
    optimizer = DistributedOptimizer(optimizer, name=name, **kwargs)
    for layer in layers:
        for var in layer.trainable_weights:
            optimizer.register_local_var(var)
    return optimizer

