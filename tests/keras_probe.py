"""One rank of a Keras 3 `fit` for tests/test_keras.py: a small dense model on fixed synthetic data, trained with
hvd_mnist.keras (or, with --wrapper horovod, Horovod's own Keras DistributedOptimizer); each rank saves what it
ends with (weights, optimizer variables, the epochs' logs) to OUT/rank<R>.npz.

Rank 0 saves OUT/model.keras after each epoch; --resume restores it on rank 0 and continues from its epoch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import keras
import numpy as np

import hvd_mnist.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
parser.add_argument("--wrapper", choices=["hvd_mnist", "horovod"], default="hvd_mnist")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--jit-compile", action="store_true")
parser.add_argument("--batchnorm", action="store_true", help="a BatchNormalization layer between the two")
args = parser.parse_args()

hvd.init()
keras.utils.set_random_seed(7)  # the same data on every rank; rank 0's initial weights go to all
images = np.random.default_rng(0).normal(size=(512, 20)).astype("float32")
labels = np.argmax(images @ np.random.default_rng(1).normal(size=(20, 4)), axis=1)
# Rank r takes every size-th example from r: batch i of every rank together is batch i of one rank at size x batch.
images, labels = images[hvd.rank()::hvd.size()], labels[hvd.rank()::hvd.size()]

norm = [keras.layers.BatchNormalization()] if args.batchnorm else []
model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(16, activation="relu"), *norm, keras.layers.Dense(4)])
optimizer = keras.optimizers.SGD(0.1, momentum=0.5) if args.optimizer == "sgd" else keras.optimizers.Adam(0.01)
if args.wrapper == "horovod":
    import horovod.tensorflow.keras as horovod_keras

    optimizer = horovod_keras.DistributedOptimizer(optimizer)
else:
    optimizer = hvd.DistributedOptimizer(optimizer)
model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
              jit_compile=args.jit_compile)

out = Path(args.out)
initial_epoch = 0
if args.resume:
    initial_epoch = hvd.broadcast_object(int((out / "epoch").read_text()) if hvd.rank() == 0 else 0)
    if hvd.rank() == 0:
        model = hvd.load_model(out / "model.keras")

callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
# Horovod's wrapper breaks the optimizer's `variables` (it calls Keras 3's list), which saving reads too: only
# the weights are broadcast, nothing is saved.
horovods = args.wrapper == "horovod"
if horovods:
    hvd.broadcast_variables(model.weights)
    callbacks = callbacks[1:]
if hvd.rank() == 0 and not horovods:
    callbacks.append(keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: (
        model.save(out / "model.keras"), (out / "epoch").write_text(str(epoch + 1)))))
history = model.fit(images, labels, batch_size=args.batch_size, epochs=args.epochs, initial_epoch=initial_epoch,
                    shuffle=False, callbacks=callbacks, verbose=0)
np.savez(out / f"rank{hvd.rank()}.npz", logs=json.dumps(history.history),
         **{f"weight{i}": w.numpy() for i, w in enumerate(model.weights)},
         **{f"optimizer{i}": v.numpy() for i, v in enumerate([] if horovods else model.optimizer.variables)})
