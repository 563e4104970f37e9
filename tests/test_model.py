"""Model shapes, the L2 term, the LR schedule and the moving-average rule."""

import numpy as np
import pytest
import tensorflow as tf

from hvd_mnist.config import MODELS
from hvd_mnist.train.model import MLP, regularized_loss
from hvd_mnist.train.schedule import MovingAverage, ema_decay, learning_rate
from hvd_mnist.train.user_model import build_model


@pytest.mark.parametrize("name", MODELS)
def test_logits_shape(name):
    model = build_model(name)
    assert model(tf.zeros([3, 784])).shape == (3, 10)


def test_mlp_is_the_classic_784_500_10():
    model = MLP()
    assert [tuple(v.shape) for v in (model.w1, model.b1, model.w2, model.b2)] == [(784, 500), (500,), (500, 10), (10,)]
    assert abs(float(tf.math.reduce_std(model.w1)) - 0.088) < 0.01  # truncated normal, stddev 0.1
    assert float(tf.reduce_max(tf.abs(model.w1))) <= 0.2 + 1e-6
    assert float(tf.reduce_sum(tf.abs(model.b1))) == 0.0


def test_l2_covers_weights_not_biases():
    model = MLP()
    expected = 1e-4 * sum(float(tf.reduce_sum(w * w)) / 2 for w in (model.w1, model.w2))
    assert float(model.l2_penalty(1e-4)) == pytest.approx(expected, rel=1e-5)
    logits = tf.zeros([2, 10])
    loss = regularized_loss(model, logits, tf.constant([0, 1], tf.int64), 1e-4)
    assert float(loss) == pytest.approx(np.log(10) + expected, rel=1e-5)


def test_learning_rate_decay():
    lr = lambda step, **kw: float(learning_rate(tf.constant(step), 0.001, 0.99, 300.0, **kw))  # noqa: E731
    assert lr(0) == pytest.approx(0.001)
    assert lr(300) == pytest.approx(0.00099)
    assert lr(600) == pytest.approx(0.001 * 0.99**2)
    assert lr(150) == pytest.approx(0.001 * 0.99**0.5)


def test_scaled_learning_rate_warms_up_linearly():
    lr = lambda step: float(learning_rate(tf.constant(step), 0.1, 1.0, 100.0, scale=4.0, warmup_steps=10))  # noqa: E731
    assert [lr(s) for s in (0, 5, 10, 50)] == pytest.approx([0.1, 0.25, 0.4, 0.4])


def test_ema_decay_rule():
    assert float(ema_decay(tf.constant(0), 0.99)) == pytest.approx(0.1)
    assert float(ema_decay(tf.constant(10), 0.99)) == pytest.approx(11 / 20)
    assert float(ema_decay(tf.constant(10_000), 0.99)) == pytest.approx(0.99)


def test_moving_average_update_and_apply():
    var = tf.Variable([1.0, 2.0])
    ema = MovingAverage([var], 0.99)
    var.assign([3.0, 6.0])
    ema.update([var], tf.constant(0))  # decay 0.1: shadow = 0.1 * old + 0.9 * new
    np.testing.assert_allclose(ema.shadows[0].numpy(), [2.8, 5.6], rtol=1e-6)
    with ema.applied([var]):
        np.testing.assert_allclose(var.numpy(), [2.8, 5.6], rtol=1e-6)
    np.testing.assert_allclose(var.numpy(), [3.0, 6.0])


@pytest.mark.parametrize("name", MODELS)
def test_mixed_precision_computes_in_float16_on_float32_variables(name):
    tf.random.set_seed(0)
    full = build_model(name)
    tf.random.set_seed(0)
    half = build_model(name, mixed_precision=True)
    assert all(v.dtype == tf.float32 for v in half.trainable_variables)
    images = tf.random.uniform([4, 784], seed=1)
    logits_full, logits_half = full(images), half(images)
    assert logits_half.dtype == tf.float32
    np.testing.assert_allclose(logits_half.numpy(), logits_full.numpy(), atol=0.05)
    assert not np.array_equal(logits_half.numpy(), logits_full.numpy())  # really rounded through float16


@pytest.mark.parametrize("name", MODELS)
def test_the_registry_counts_what_the_built_model_has(name):
    """The scaling plan's parameter and gradient-tensor counts, read without TensorFlow, are the built model's."""
    record, variables = MODELS[name], build_model(name).trainable_variables
    assert (record.params, record.gradient_tensors) == (sum(v.shape.num_elements() for v in variables), len(variables))
