"""Models of "a user", for tests/test_user_model.py: the trainer imports them by --model user_models:NAME with this
folder on PYTHONPATH, as a user's own package would be."""

from __future__ import annotations

import keras


def small_cnn() -> keras.Model:
    """A small Keras 3 CNN for 28 x 28 digits: what docs/guide.md shows."""
    return keras.Sequential([
        keras.Input(shape=(784,)),
        keras.layers.Reshape((28, 28, 1)),
        keras.layers.Conv2D(8, 5, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10),
    ])


def twelve_classes() -> keras.Model:
    return keras.Sequential([keras.Input(shape=(784,)), keras.layers.Dense(12)])


def broken() -> keras.Model:
    raise RuntimeError("this factory always fails")
