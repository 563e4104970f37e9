"""tf.data input pipelines: each rank reads its own shard, shuffled, repeated, batched and prefetched."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from hvd_mnist.data.records import parsed_batches
from hvd_mnist.data.sources import Split

SHUFFLE_BUFFER = 10_000

# An in-memory split, or the TFRecord files holding one.
Source = Split | Sequence[str]


def scale_pixels(images: tf.Tensor) -> tf.Tensor:
    """uint8 pixels 0..255 to float32 in [0, 1]."""
    return tf.cast(images, tf.float32) / 255.0


def _shard(source: Source, rank: int, size: int) -> tf.data.Dataset:
    """This rank's examples as (uint8 image [784], int64 label), every size-th one starting at rank.

    TFRecords are parsed once, a batch at a time, and cached decoded, so later epochs cost no parsing.
    """
    if isinstance(source, Split):
        return tf.data.Dataset.from_tensor_slices((source.images, source.labels)).shard(size, rank)
    records = tf.data.TFRecordDataset(list(source)).shard(size, rank)
    return parsed_batches(records).unbatch().cache()


def _scaled(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return scale_pixels(images), labels


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
    dataset = _shard(source, rank, size)
    if shuffle:
        dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=seed + rank, reshuffle_each_iteration=True)
    dataset = dataset.repeat().batch(batch_size, drop_remainder=True)
    if start_step:
        dataset = dataset.skip(start_step)
    return dataset.map(_scaled, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def eval_dataset(source: Source, batch_size: int, rank: int, size: int) -> tf.data.Dataset:
    """One pass over this rank's shard of the evaluation split."""
    dataset = _shard(source, rank, size).batch(batch_size)
    return dataset.map(_scaled, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
