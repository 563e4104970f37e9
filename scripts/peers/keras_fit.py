"""Racer: Keras 3 `model.fit` with hvd_mnist.keras, as a user of examples/keras_fit.py trains, on the benchmark's MLP.

The model is hvd_mnist's MLP 784-500-10 written as a Keras Sequential (the same initializers), plain SGD wrapped in
hvd_mnist.keras.DistributedOptimizer, the broadcast and metric-average callbacks, each rank on its own shard of
the data (every size-th example), shuffled with a 10,000 buffer; `fit` runs the steps as one epoch with Keras's
defaults (one step per compiled call). Launched with `horovodrun --gloo -np 2`; with --eval-every and
--target-accuracy it stops once the validation accuracy reaches the target (common.TargetRace).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from common import HIDDEN, INIT_STDDEV, PHASES, StepTimer, TargetRace, load_npz, parse_args, scaled, write_throughput
from hvd_example import sum_over_ranks
from tf_common import set_threads, thread_counts

import hvd_mnist.keras as hvd


def build_mlp() -> keras.Model:
    init = keras.initializers.TruncatedNormal(stddev=INIT_STDDEV, seed=0)
    return keras.Sequential([keras.Input((784,)),
                             keras.layers.Dense(HIDDEN, activation="relu", kernel_initializer=init),
                             keras.layers.Dense(10, kernel_initializer=init)])


class Stepping(keras.callbacks.Callback):
    """Times each step (StepTimer) and, every --eval-every steps, validates and stops fit at the target."""

    def __init__(self, timer: StepTimer, race: TargetRace) -> None:
        super().__init__()
        self.timer, self.race = timer, race

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.timer.tick()
        steps = self.timer.steps
        if self.race.due(steps) and self.race.reaches_target(steps, self.correct, sum_over_ranks):
            self.model.stop_training = True

    def correct(self, images: np.ndarray, labels: np.ndarray) -> int:
        logits = self.model.predict_on_batch(scaled(images))
        return int(np.sum(np.argmax(logits, axis=1) == labels))


def main() -> None:
    args = parse_args(__doc__)
    set_threads(args.threads)
    hvd.init()
    PHASES.done("rendezvous_done")
    images, labels = load_npz(args.data)
    images, labels = images[hvd.rank()::hvd.size()], labels[hvd.rank()::hvd.size()]
    dataset = tf.data.Dataset.from_tensor_slices((scaled(images), labels)).repeat().shuffle(10_000, seed=0)
    model = build_mlp()
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr)),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    timer = StepTimer(args.warmup_steps)
    race = TargetRace.from_args(args, hvd.rank(), hvd.size())
    stepping = Stepping(timer, race)
    PHASES.done("data_ready")
    model.fit(dataset.batch(args.batch_size), steps_per_epoch=args.steps, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), stepping])
    PHASES.done("trained")
    if hvd.rank() == 0:
        test = load_npz(args.test_data) if args.test_data else None
        accuracy = stepping.correct(*test) / len(test[1]) if test else None
        write_throughput(args.out, timer, args.batch_size * hvd.size(), race, test_accuracy=accuracy,
                         workers=hvd.size(), **thread_counts())


if __name__ == "__main__":
    main()
