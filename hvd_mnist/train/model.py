"""The classic models as plain tf.Modules: the MLP 784-500-10 and LeNet-5, with their L2 term."""

from __future__ import annotations

import tensorflow as tf

from hvd_mnist.data.idx import IMAGE_SIDE, NUM_CLASSES, NUM_PIXELS

INIT_STDDEV = 0.1


def _weight(shape: list[int], name: str) -> tf.Variable:
    return tf.Variable(tf.random.truncated_normal(shape, stddev=INIT_STDDEV), name=name)


def _bias(size: int, name: str) -> tf.Variable:
    return tf.Variable(tf.zeros([size]), name=name)


class Classifier(tf.Module):
    """Common interface: float32 logits for float images [B, 784]; `weights` are the L2-regularized variables.

    Variables are float32; with `compute_dtype` float16 (mixed precision) the layers run in float16 on
    cast copies of them, and the logits are cast back to float32 for a stable loss.
    """

    weights: tuple[tf.Variable, ...]
    compute_dtype: tf.DType = tf.float32

    def cast(self, value: tf.Tensor) -> tf.Tensor:
        """A variable or input in the compute dtype."""
        return tf.cast(value, self.compute_dtype)

    def l2_penalty(self, scale: float) -> tf.Tensor:
        """scale * sum(w**2) / 2 over the weight matrices (biases are not regularized)."""
        return scale * tf.add_n([tf.nn.l2_loss(w) for w in self.weights])


class MLP(Classifier):
    """784 -> 500 ReLU -> 10, the classic script's network."""

    def __init__(self, hidden: int = 500) -> None:
        super().__init__(name="mlp")
        self.w1 = _weight([NUM_PIXELS, hidden], "layer1_weights")
        self.b1 = _bias(hidden, "layer1_biases")
        self.w2 = _weight([hidden, NUM_CLASSES], "layer2_weights")
        self.b2 = _bias(NUM_CLASSES, "layer2_biases")
        self.weights = (self.w1, self.w2)

    def __call__(self, images: tf.Tensor) -> tf.Tensor:
        c = self.cast
        hidden = tf.nn.relu(tf.matmul(c(images), c(self.w1)) + c(self.b1))
        return tf.cast(tf.matmul(hidden, c(self.w2)) + c(self.b2), tf.float32)


class LeNet5(Classifier):
    """conv5x5x32 - pool - conv5x5x64 - pool - fc512 - fc10 (the classic LeNet-5 variant, no dropout)."""

    def __init__(self) -> None:
        super().__init__(name="lenet5")
        self.conv1_w = _weight([5, 5, 1, 32], "conv1_weights")
        self.conv1_b = _bias(32, "conv1_biases")
        self.conv2_w = _weight([5, 5, 32, 64], "conv2_weights")
        self.conv2_b = _bias(64, "conv2_biases")
        flat = (IMAGE_SIDE // 4) ** 2 * 64
        self.fc1_w = _weight([flat, 512], "fc1_weights")
        self.fc1_b = _bias(512, "fc1_biases")
        self.fc2_w = _weight([512, NUM_CLASSES], "fc2_weights")
        self.fc2_b = _bias(NUM_CLASSES, "fc2_biases")
        self.weights = (self.fc1_w, self.fc2_w)

    def __call__(self, images: tf.Tensor) -> tf.Tensor:
        c = self.cast
        x = tf.reshape(c(images), [-1, IMAGE_SIDE, IMAGE_SIDE, 1])
        for w, b in ((self.conv1_w, self.conv1_b), (self.conv2_w, self.conv2_b)):
            x = tf.nn.relu(tf.nn.conv2d(x, c(w), strides=1, padding="SAME") + c(b))
            x = tf.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME")
        x = tf.reshape(x, [-1, self.fc1_w.shape[0]])
        x = tf.nn.relu(tf.matmul(x, c(self.fc1_w)) + c(self.fc1_b))
        return tf.cast(tf.matmul(x, c(self.fc2_w)) + c(self.fc2_b), tf.float32)


def cross_entropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Per-example sparse softmax cross-entropy [B]."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def regularized_loss(model: Classifier, logits: tf.Tensor, labels: tf.Tensor, l2_scale: float) -> tf.Tensor:
    """Mean cross-entropy of the logits plus the model's L2 penalty, as in the classic script."""
    return tf.reduce_mean(cross_entropy(logits, labels)) + model.l2_penalty(l2_scale)


def correct_predictions(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """How many argmax predictions equal the labels (int64 scalar)."""
    return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.int64))
