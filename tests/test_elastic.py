"""Which errors Horovod Elastic gets to handle (the rolls-back themselves are in test_reliability.py)."""

from __future__ import annotations

import tensorflow as tf
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from hvd_mnist.runtime.world.elastic import elastic_signal


def test_a_failed_horovod_op_of_any_kind_rolls_back():
    """hvd.elastic.run itself converts only three op names, and returns None for any other failed op."""
    failed = tf.errors.UnknownError(None, None, "{{node HorovodGroupedAllreduce}} Horovod has been shut down")
    signal = elastic_signal(failed)
    assert isinstance(signal, HorovodInternalError) and signal.args == (failed,)
    for own in (HorovodInternalError("lost a peer"), HostsUpdatedInterrupt(False)):
        assert elastic_signal(own) is own


def test_other_errors_are_not_horovods_to_handle():
    assert elastic_signal(tf.errors.InvalidArgumentError(None, None, "logits and labels differ in shape")) is None
    assert elastic_signal(ValueError("Horovod")) is None
