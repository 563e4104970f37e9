"""Peer: the pattern of Horovod's examples/tensorflow2/tensorflow2_mnist.py, ported to the benchmark's MLP.

As in that example: every worker holds the whole training set in memory (no sharding), shuffles it with a
10,000 buffer, wraps its tape in hvd.DistributedGradientTape, broadcasts the variables after the first step
and prints the loss every 10 steps; Launched with
`horovodrun --gloo -np 2`. Differences: the MLP and plain SGD instead of the example's CNN and Adam, and, with
--eval-every and --target-accuracy, a stop once the validation accuracy reaches the target (common.TargetRace;
the counts are summed with hvd.allreduce).
"""

from __future__ import annotations

import functools

import horovod.tensorflow as hvd
import tensorflow as tf
from common import PHASES, StepTimer, TargetRace, load_npz, parse_args, scaled, write_throughput
from tf_common import build_mlp, mean_cross_entropy, num_correct, set_threads, sgd_update, test_accuracy, thread_counts


def sum_over_ranks(values: list[float]) -> list[float]:
    return hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum, name="validation_counts").numpy().tolist()


def main() -> None:
    args = parse_args(__doc__)
    set_threads(args.threads)
    hvd.init()
    PHASES.done("rendezvous_done")
    images, labels = load_npz(args.data)
    dataset = tf.data.Dataset.from_tensor_slices((scaled(images), labels)).repeat().shuffle(10_000)
    dataset = dataset.batch(args.batch_size)
    model = build_mlp()
    variables = list(model.trainable_variables)
    lr = tf.constant(args.lr)

    @tf.function
    def training_step(images: tf.Tensor, labels: tf.Tensor, first_batch: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = mean_cross_entropy(model, images, labels)
        tape = hvd.DistributedGradientTape(tape)
        sgd_update(variables, tape.gradient(loss, variables), lr)
        if first_batch:
            hvd.broadcast_variables(variables, root_rank=0)
        return loss

    timer = StepTimer(args.warmup_steps)
    race = TargetRace.from_args(args, hvd.rank(), hvd.size())
    correct = functools.partial(num_correct, model)
    PHASES.done("data_ready")
    for batch, (batch_images, batch_labels) in enumerate(dataset.take(args.steps)):
        loss = training_step(batch_images, batch_labels, batch == 0)
        if batch % 10 == 0 and hvd.rank() == 0:
            print(f"step {batch}  loss {float(loss):.6f}", flush=True)
        timer.tick()
        if race.due(timer.steps) and race.reaches_target(timer.steps, correct, sum_over_ranks):
            break
    float(loss)
    PHASES.done("trained")
    if hvd.rank() == 0:
        accuracy = test_accuracy(model, *load_npz(args.test_data)) if args.test_data else None
        write_throughput(args.out, timer, args.batch_size * hvd.size(), race, test_accuracy=accuracy,
                         workers=hvd.size(), **thread_counts())


if __name__ == "__main__":
    main()
