"""Export the moving-average weights as a SavedModel with a serving signature."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from hvd_mnist.config import TrainConfig
from hvd_mnist.data.idx import NUM_PIXELS
from hvd_mnist.train.model import Classifier
from hvd_mnist.train.schedule import MovingAverage
from hvd_mnist.train.user_model import build_model


class ServingModel(tf.Module):
    """Wraps a classifier with a `serve` signature: float images in [0, 1] -> classes and probabilities."""

    def __init__(self, model: Classifier) -> None:
        super().__init__(name="serving_model")
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, NUM_PIXELS], tf.float32, name="images")], autograph=False)
    def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = self.model(images)
        return {"classes": tf.argmax(logits, axis=1), "probabilities": tf.nn.softmax(logits)}


def export_model(model: Classifier, ema: MovingAverage, directory: Path) -> Path:
    """Save the model with its moving-average weights in place of the trained ones."""
    with ema.applied(list(model.trainable_variables)):
        serving = ServingModel(model)
        tf.saved_model.save(serving, str(directory), signatures={"serving_default": serving.serve})
    return directory


def export_checkpoint(checkpoint_path: str, config: TrainConfig, directory: Path) -> Path:
    """Export the moving-average weights stored in a checkpoint (say, the best one) instead of the live ones."""
    model = build_model(config.model, config.mixed_precision, config.seed)
    ema = MovingAverage(list(model.trainable_variables), config.ema_decay)
    tf.train.Checkpoint(model=model, ema=ema).restore(checkpoint_path).expect_partial()
    return export_model(model, ema, directory)
