"""Peer: the pattern of Horovod's examples/tensorflow2/tensorflow2_mnist.py, ported to the benchmark's MLP.

As in that example: every worker holds the whole training set in memory (no sharding), shuffles it with a
10,000 buffer, wraps its tape in hvd.DistributedGradientTape, broadcasts the variables after the first step
and prints the loss every 10 steps; Launched with
`horovodrun --gloo -np 2`. Differences: the MLP and plain SGD instead of the example's CNN and Adam.
"""

from __future__ import annotations

import horovod.tensorflow as hvd
import tensorflow as tf
from common import StepTimer, load_npz, parse_args, scaled, write_throughput
from tf_common import build_mlp, mean_cross_entropy, set_threads, sgd_update, test_accuracy, thread_counts


def main() -> None:
    args = parse_args(__doc__)
    set_threads(args.threads)
    hvd.init()
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
    for batch, (batch_images, batch_labels) in enumerate(dataset.take(args.steps)):
        loss = training_step(batch_images, batch_labels, batch == 0)
        if batch % 10 == 0 and hvd.rank() == 0:
            print(f"step {batch}  loss {float(loss):.6f}", flush=True)
        timer.tick()
    float(loss)
    if hvd.rank() == 0:
        accuracy = test_accuracy(model, *load_npz(args.test_data)) if args.test_data else None
        write_throughput(args.out, timer, args.batch_size * hvd.size(), test_accuracy=accuracy,
                         workers=hvd.size(), **thread_counts())


if __name__ == "__main__":
    main()
