"""Peer: TensorFlow's own tf.distribute.MultiWorkerMirroredStrategy, one worker per local process.

TF_CONFIG names every worker at 127.0.0.1 on the ports the benchmark picked; a custom training loop runs
`strategy.run` on each worker's shard (distribute_datasets_from_function), all-reduces the gradient list
with the replica context (ring collectives over gRPC) and applies plain SGD. The model's variables are
plain tf.Variables (hvd_mnist's tf.Module MLP) created with ONLY_FIRST_REPLICA aggregation, so no Keras 3
optimizer is involved. With --eval-every and --target-accuracy it stops once the validation accuracy reaches
the target (common.TargetRace; the counts are summed by the same replica-context all_reduce, in its own
tf.function).
"""

from __future__ import annotations

import functools
import json
import os

import tensorflow as tf
from common import PHASES, LocalWorld, StepTimer, TargetRace, load_npz, parse_args, scaled, write_throughput
from tf_common import build_mlp, mean_cross_entropy, num_correct, set_threads, sgd_update, test_accuracy, thread_counts


def make_strategy(world: LocalWorld) -> tf.distribute.MultiWorkerMirroredStrategy:
    """The strategy for this worker, its cluster on 127.0.0.1 only."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in world.ports]}
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": world.rank}})
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def first_replica_variables(next_creator, **kwargs) -> tf.Variable:
    """Every replica applies the same all-reduced update, so the first replica's value is the value."""
    kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
    return next_creator(**kwargs)


def replica_sum(values: tf.Tensor) -> tf.Tensor:
    return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, values)


def main() -> None:
    args = parse_args(__doc__)
    set_threads(args.threads)
    world = LocalWorld.from_env()
    strategy = make_strategy(world)
    PHASES.done("rendezvous_done")
    images, labels = load_npz(args.data)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = tf.data.Dataset.from_tensor_slices((scaled(images), labels))
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset.shuffle(10_000).repeat().batch(args.batch_size, drop_remainder=True).prefetch(2)

    batches = iter(strategy.distribute_datasets_from_function(dataset_fn))
    with strategy.scope(), tf.variable_creator_scope(first_replica_variables):
        model = build_mlp()
    variables = list(model.trainable_variables)
    lr = tf.constant(args.lr)

    def replica_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = mean_cross_entropy(model, images, labels)
        grads = tape.gradient(loss, variables)
        grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, grads)
        sgd_update(variables, grads, lr)
        return loss

    @tf.function
    def train_step(iterator) -> tf.Tensor:
        losses = strategy.run(replica_step, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    @tf.function
    def sum_over_workers(values: tf.Tensor) -> tf.Tensor:
        return strategy.experimental_local_results(strategy.run(replica_sum, args=(values,)))[0]

    def sum_over_ranks(values: list[float]) -> list[float]:
        return sum_over_workers(tf.constant(values, tf.float32)).numpy().tolist()

    timer = StepTimer(args.warmup_steps)
    race = TargetRace.from_args(args, world.rank, world.size)
    correct = functools.partial(num_correct, model)
    PHASES.done("data_ready")
    for _ in range(args.steps):
        loss = train_step(batches)
        timer.tick()
        if race.due(timer.steps) and race.reaches_target(timer.steps, correct, sum_over_ranks):
            break
    float(loss)
    PHASES.done("trained")
    if world.rank == 0:
        accuracy = test_accuracy(model, *load_npz(args.test_data)) if args.test_data else None
        write_throughput(args.out, timer, args.batch_size * world.size, race, test_accuracy=accuracy,
                         workers=strategy.num_replicas_in_sync, **thread_counts())


if __name__ == "__main__":
    main()
