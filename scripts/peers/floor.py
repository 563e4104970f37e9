"""Compute floor: the MLP's forward + backward + SGD update in one tf.function on in-memory tensors.

One process, no Horovod, no input pipeline: the same batch is fed every step, so this is the best the
machine does for the model itself. The learning rate is a tensor so that the function is traced once.
"""

from __future__ import annotations

import tensorflow as tf
from common import StepTimer, load_npz, parse_args, scaled, write_throughput
from tf_common import build_mlp, mean_cross_entropy, set_threads, sgd_update, thread_counts


def main() -> None:
    args = parse_args(__doc__)
    set_threads(args.threads)
    images, labels = load_npz(args.data)
    batch_images = tf.constant(scaled(images[: args.batch_size]))
    batch_labels = tf.constant(labels[: args.batch_size])
    lr = tf.constant(args.lr)
    model = build_mlp()
    variables = list(model.trainable_variables)

    @tf.function
    def train_step(images: tf.Tensor, labels: tf.Tensor, lr: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = mean_cross_entropy(model, images, labels)
        sgd_update(variables, tape.gradient(loss, variables), lr)
        return loss

    timer = StepTimer(args.warmup_steps)
    loss = None
    for _ in range(args.steps):
        loss = train_step(batch_images, batch_labels, lr)  # CPU eager calls return when the step is done
        timer.tick()
    float(loss)
    write_throughput(args.out, timer, args.batch_size, **thread_counts())


if __name__ == "__main__":
    main()
