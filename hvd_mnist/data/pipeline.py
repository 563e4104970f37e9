"""tf.data input pipelines: each rank reads its own shard, shuffled, repeated, batched and prefetched."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from hvd_mnist.data.records import parse_batch
from hvd_mnist.data.sources import Split

SHUFFLE_BUFFER = 10_000

# An in-memory split, or the TFRecord files holding one.
Source = Split | Sequence[str]


def scale_pixels(images: tf.Tensor) -> tf.Tensor:
    """uint8 pixels 0..255 to float32 in [0, 1]."""
    return tf.cast(images, tf.float32) / 255.0


def _raw_examples(source: Source) -> tuple[tf.data.Dataset, Callable]:
    """Unparsed examples, and the function that turns a batch of them into (float images, int64 labels)."""
    if isinstance(source, Split):
        dataset = tf.data.Dataset.from_tensor_slices((source.images, source.labels))
        return dataset, lambda images, labels: (scale_pixels(images), labels)
    dataset = tf.data.TFRecordDataset(list(source))

    def decode(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        images, labels = parse_batch(serialized)
        return scale_pixels(images), labels

    return dataset, decode


def train_dataset(
    source: Source,
    batch_size: int,
    rank: int,
    size: int,
    seed: int,
    shuffle: bool = True,
    start_step: int = 0,
) -> tf.data.Dataset:
    """Endless batches of this rank's shard; batch k is the same in every run with the same seed.

    Sharding takes every size-th example starting at rank, so the shards are disjoint and together
    complete. `start_step` skips the batches already trained on, so a resumed run sees what an
    uninterrupted one would have seen next.
    """
    dataset, decode = _raw_examples(source)
    dataset = dataset.shard(size, rank)
    if shuffle:
        dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=seed + rank, reshuffle_each_iteration=True)
    dataset = dataset.repeat().batch(batch_size, drop_remainder=True)
    if start_step:
        dataset = dataset.skip(start_step)
    return dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def eval_dataset(source: Source, batch_size: int, rank: int, size: int) -> tf.data.Dataset:
    """One pass over this rank's shard of the evaluation split."""
    dataset, decode = _raw_examples(source)
    dataset = dataset.shard(size, rank).batch(batch_size)
    return dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
