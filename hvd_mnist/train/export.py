"""Export the moving-average weights as a SavedModel with a serving signature, at the end of a run as --export
says."""

from __future__ import annotations

import logging
from pathlib import Path

import tensorflow as tf

from hvd_mnist.config import TrainConfig
from hvd_mnist.data.idx import NUM_PIXELS
from hvd_mnist.runtime.supervisor import World, writing
from hvd_mnist.train.checkpointing import Checkpoints
from hvd_mnist.train.model import Classifier
from hvd_mnist.train.schedule import MovingAverage
from hvd_mnist.train.user_model import build_model

log = logging.getLogger("hvd_mnist")


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


def export_at_end(config: TrainConfig, world: World, model: Classifier, ema: MovingAverage, checkpoints: Checkpoints,
                  target: Path) -> None:
    """The run's model as --export asks: the final moving-average weights, or the best checkpoint's (if one was
    kept), or none. Rank 0 writes it: the ranks hold the same weights."""
    if not world.is_chief:
        return
    with writing("the exported model", target):
        if config.export == "final":
            log.info("exported the moving-average model to %s", export_model(model, ema, target))
        elif config.export == "best" and checkpoints.best is not None:
            log.info("exported the best checkpoint's moving-average model (%s) to %s", checkpoints.best,
                     export_checkpoint(checkpoints.best, config, target))
