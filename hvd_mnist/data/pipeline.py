"""tf.data input pipelines over an in-memory split: each rank keeps its own shard as uint8 tensors.

Training batches are gathered whole from a per-epoch permutation of the shard's indices, so tf.data does
no per-example work on the cores that train; pixels stay uint8 until the training step scales them.
"""

from __future__ import annotations

import tensorflow as tf

from hvd_mnist.data.sources import Split

PREFETCH_BATCHES = 2


def scale_pixels(images: tf.Tensor) -> tf.Tensor:
    """uint8 pixels 0..255 to float32 in [0, 1]."""
    return tf.cast(images, tf.float32) / 255.0


def shard(split: Split, rank: int, size: int) -> Split:
    """This rank's examples: every size-th one starting at rank (disjoint shards that together are complete)."""
    return Split(split.images[rank::size], split.labels[rank::size])  # HVD: this rank's shard


def _not_autotuned() -> tf.data.Options:
    """tf.data's autotuning off, for the training pipeline (with a fixed prefetch of two batches).

    Deleting an autotuned iterator that is not exhausted (the training iterator, at every run's end) blocks
    for seconds on TF 2.21 (docs/benchmark.md). A batch is a gather from memory, far faster than a step, so
    two ready batches are all the overlap a step needs.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def _index_batches(count: int, batch_size: int, seed: int, shuffle: bool) -> tf.data.Dataset:
    """Endless int64 [batch_size] index vectors into a shard of `count` examples.

    Epoch e is a permutation of 0..count-1 drawn from (seed, e), or 0..count-1 in order without shuffling;
    the epochs are laid end to end and cut into batches, so a batch may span two epochs (as
    repeat().batch() would), and batch k is a function of the seed alone.
    """

    @tf.autograph.experimental.do_not_convert  # plain TF ops: AutoGraph's conversion only costs start-up time
    def epoch_order(epoch: tf.Tensor) -> tf.Tensor:
        indices = tf.range(count, dtype=tf.int64)
        if not shuffle:
            return indices
        return tf.random.experimental.stateless_shuffle(indices, seed=tf.stack([tf.constant(seed, tf.int64), epoch]))

    # rebatch cuts the stream of epochs into batches across their ends with no function of its own to trace:
    # half the pipeline's build time at start-up against a scan and a flat_map (docs/benchmark.md).
    return tf.data.Dataset.counter().map(epoch_order).rebatch(batch_size, drop_remainder=True)


def train_dataset(
    split: Split,
    batch_size: int,
    rank: int,
    size: int,
    seed: int,
    shuffle: bool = True,
    start_step: int = 0,
) -> tf.data.Dataset:
    """Endless (uint8 images [B, 784], int64 labels [B]) batches of this rank's shard.

    Batch k is the same in every run with the same seed; `start_step` skips the batches already trained
    on (only their indices are computed), so a resumed run sees what an uninterrupted one would see next.
    """
    mine = shard(split, rank, size)
    if len(mine) == 0:
        raise ValueError(f"rank {rank} of {size} has no training examples ({len(split)} in all)")
    images, labels = tf.constant(mine.images), tf.constant(mine.labels)
    batches = _index_batches(len(mine), batch_size, seed + rank, shuffle).skip(start_step)
    gather = tf.autograph.experimental.do_not_convert(lambda indices: (tf.gather(images, indices),
                                                                       tf.gather(labels, indices)))
    return batches.map(gather).prefetch(PREFETCH_BATCHES).with_options(_not_autotuned())


def eval_batches(split: Split, batch_size: int, rank: int, size: int) -> list[tuple[tf.Tensor, tf.Tensor]]:
    """This rank's shard of an evaluation split as in-memory (uint8 images, int64 labels) batches, in order.

    Made once and reused at every evaluation: building a tf.data pipeline per evaluation cost as much as
    evaluating (docs/benchmark.md).
    """
    mine = shard(split, rank, size)
    return [(tf.constant(mine.images[start:start + batch_size]), tf.constant(mine.labels[start:start + batch_size]))
            for start in range(0, len(mine), batch_size)]
