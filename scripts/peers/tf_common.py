"""The TensorFlow workers' shared pieces: hvd_mnist's own MLP, the plain loss, an SGD update and accuracy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from common import scaled

from hvd_mnist.train.model import MLP


def build_mlp(seed: int = 0) -> MLP:
    """hvd_mnist's MLP 784-500-10 (truncated-normal weights, zero biases), so every worker trains the same model."""
    tf.random.set_seed(seed)
    return MLP()


def mean_cross_entropy(model: MLP, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Mean sparse softmax cross-entropy (no L2 term: the peers' plain loss)."""
    logits = model(images)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def sgd_update(variables: list[tf.Variable], grads: list[tf.Tensor], lr: tf.Tensor) -> None:
    """Plain SGD: v -= lr * g."""
    for var, grad in zip(variables, grads, strict=True):
        var.assign_sub(lr * grad)


def num_correct(model: MLP, images: np.ndarray, labels: np.ndarray) -> int:
    """Correct argmax predictions on uint8 images (eager, one batch)."""
    logits = model(tf.constant(scaled(images)))
    return int(np.sum(np.argmax(logits.numpy(), axis=1) == labels))


def test_accuracy(model: MLP, images: np.ndarray, labels: np.ndarray) -> float:
    """Share of correct argmax predictions on the whole test set."""
    return num_correct(model, images, labels) / len(labels)


def set_threads(threads: int) -> None:
    """hvd_mnist's CPU rule for a worker given `threads` cores: that many intra-op, min(2, that) inter-op threads."""
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))


def thread_counts() -> dict[str, int]:
    """TensorFlow's intra- and inter-op thread settings (0 means TensorFlow's default: one per core)."""
    return {"intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()}
