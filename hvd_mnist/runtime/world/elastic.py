"""Elastic training state: the variables that a Horovod Elastic reset rolls back and re-broadcasts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.elastic import ObjectState
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from hvd_mnist.runtime.storage.rundir import ELASTIC_CLAIM_WAIT_S, RunDir, claim
from hvd_mnist.runtime.world.distribution import World

T = TypeVar("T")


class VariablesState(ObjectState):
    """Commit = copy the variables' values; restore = put them back; sync = broadcast rank 0's.

    Horovod's own TensorFlowState broadcasts only once, in its constructor, when running eagerly, so
    a worker that joins later would keep its fresh initialization; this state broadcasts on every sync,
    with `broadcast` (the replica's own broadcast of these variables from rank 0).
    Its constructor runs no collective, so late joiners can build it before `hvd.elastic.run`.
    """

    def __init__(self, variables: list[tf.Variable], broadcast: Callable[[], None]) -> None:
        self.variables = variables
        self._broadcast = broadcast
        self._values = self._read()
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)

    def _read(self) -> list[tf.Tensor]:
        return [tf.identity(var) for var in self.variables]

    def save(self) -> None:
        self._values = self._read()
        super().save()

    def restore(self) -> None:
        for var, value in zip(self.variables, self._values, strict=True):
            var.assign(value)
        super().restore()

    def sync(self) -> None:
        self._broadcast()
        self._values = self._read()
        super().sync()


def elastic_signal(err: BaseException) -> BaseException | None:
    """What to raise to Horovod Elastic for `err`, so that it rolls back and goes on; None if `err` is not its.

    A failed Horovod op becomes HorovodInternalError here: hvd.elastic.run only converts an UnknownError whose
    message names HorovodAllreduce, HorovodAllgather or HorovodBroadcast, and returns None for any other
    (HorovodGroupedAllreduce's among them), which would end the run as if it had finished.
    """
    if isinstance(err, (HorovodInternalError, HostsUpdatedInterrupt)):
        return err
    if isinstance(err, tf.errors.OpError) and "Horovod" in str(err):
        return HorovodInternalError(err)
    return None


def run_elastic(state: VariablesState, world: World, run_dir: RunDir, train: Callable[[World], T]) -> T:
    """Run `train` under Horovod Elastic: after every reset's sync it gets the world as it now is, and a survivor
    that became rank 0 first takes over the run directory's lock."""

    @hvd.elastic.run
    def run(_state: VariablesState) -> T:
        current = world.refreshed()
        if current.is_chief:
            claim(run_dir, wait_s=ELASTIC_CLAIM_WAIT_S)
        return train(current)

    return run(state)
