"""A model the user wrote, trained without editing hvd_mnist: `--model my_pkg.models:small_cnn` names a function
that returns a Keras 3 model or a tf.Module mapping [batch, 784] pixels in [0, 1] to [batch, 10] logits.

It is wrapped behind the built-in models' interface (train/model.py's Classifier), so the replica, the
allreduce, the moving averages, checkpoints and the export treat it as one of theirs. What the wrapper hands
them are the model's own tf.Variables (a Keras 3 variable's `.value`): Horovod's broadcast and
tf.GradientTape work on those, not on Keras 3's wrappers. Only trainable variables are synced and
checkpointed, so a model with other state (BatchNorm's statistics) is not supported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import tensorflow as tf

from hvd_mnist.data.idx import NUM_CLASSES, NUM_PIXELS
from hvd_mnist.errors import UserError
from hvd_mnist.model_registry import MODELS
from hvd_mnist.runtime.supervisor import import_keras
from hvd_mnist.train.model import Classifier

PROBE_BATCH = 2


def load_factory(spec: str) -> Callable[[], object]:
    """The function `spec` ("module.path:function") names, imported from the Python path; UserError if not."""
    module_name, _, function_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # the user's module may fail in any way while it imports
        raise UserError(f"--model {spec}: cannot import {module_name}: {type(err).__name__}: {err}") from None
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise UserError(f"--model {spec}: {module_name} has no function {function_name}") from None
    return factory


class UserModel(Classifier):
    """The user's network behind the Classifier interface; its L2 term covers every weight of rank 2 or more."""

    def __init__(self, spec: str, seed: int) -> None:
        super().__init__(name="user_model")
        import_keras()  # before the user's module, which may import it: so it comes without matplotlib
        factory = load_factory(spec)
        # Keras 3 draws unseeded initial weights from its own generator: seeded here, a run and its rerun start
        # from the same weights (the ranks would agree anyway: rank 0's are broadcast).
        import keras

        keras.utils.set_random_seed(seed)
        try:
            network = factory()
            logits = network(tf.zeros([PROBE_BATCH, NUM_PIXELS]))  # also builds a model that builds on first call
            variables = [v if isinstance(v, tf.Variable) else v.value for v in network.trainable_variables]
        except UserError:
            raise
        except Exception as err:
            raise UserError(f"--model {spec}: building it failed: {type(err).__name__}: {err}") from None
        shape = tuple(getattr(logits, "shape", ()))
        if shape != (PROBE_BATCH, NUM_CLASSES):
            raise UserError(f"--model {spec} gives outputs of shape {shape} for {PROBE_BATCH} images; it must map "
                            f"[batch, {NUM_PIXELS}] pixels to [batch, {NUM_CLASSES}] logits")
        if not variables:
            raise UserError(f"--model {spec} has no trainable variables")
        self.network = network
        self._trainable = tuple(variables)
        self.weights = tuple(v for v in variables if v.shape.rank >= 2)

    @property
    def trainable_variables(self) -> tuple[tf.Variable, ...]:
        return self._trainable

    def __call__(self, images: tf.Tensor) -> tf.Tensor:
        return tf.cast(self.network(images), tf.float32)


def build_model(name: str, mixed_precision: bool = False, seed: int = 0) -> Classifier:
    """A model by its --model name: a built-in one by the registry's builder, or the user's MODULE:FUNCTION
    (its initial weights drawn from `seed`); mixed precision computes in float16 on float32 variables."""
    if name not in MODELS:
        return UserModel(name, seed)
    model = load_factory(MODELS[name].builder)()
    if mixed_precision:
        model.compute_dtype = tf.float16
    return model
