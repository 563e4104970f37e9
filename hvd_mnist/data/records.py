"""TFRecords in the classic schema: image_raw (784 uint8 bytes), pixels (int64 = 784), label (int64)."""

from __future__ import annotations

import inspect
import itertools
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf

from hvd_mnist.data.idx import NUM_CLASSES, NUM_PIXELS
from hvd_mnist.data.sources import Split, check_labels
from hvd_mnist.errors import UserError, first_line

PARSE_BATCH = 8192  # records parsed in one call
FEATURES = {
    "image_raw": tf.io.FixedLenFeature([], tf.string),
    "pixels": tf.io.FixedLenFeature([], tf.int64),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


def _int64(value: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def serialize_example(image: np.ndarray, label: int) -> bytes:
    """One example as a serialized tf.train.Example."""
    features = {
        "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.astype(np.uint8).tobytes()])),
        "pixels": _int64(int(image.size)),
        "label": _int64(int(label)),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def write_records(path: str | Path, split: Split) -> int:
    """Write a split to one TFRecord file, atomically (a .tmp file renamed at the end)."""
    check_labels(split.labels, str(path))
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tf.io.TFRecordWriter(str(tmp)) as writer:
        for image, label in zip(split.images, split.labels, strict=True):
            writer.write(serialize_example(image, label))
    tmp.replace(path)
    return len(split)


def parse_batch(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Parse a batch of serialized examples into (uint8 images [B, 784], int64 labels [B]), validated."""
    parsed = tf.io.parse_example(serialized, FEATURES)
    checks = [
        tf.debugging.assert_equal(parsed["pixels"], tf.constant(NUM_PIXELS, tf.int64),
                                  message="TFRecord feature pixels is not 784"),
        tf.debugging.assert_less(parsed["label"], tf.constant(NUM_CLASSES, tf.int64),
                                 message="TFRecord label outside 0..9"),
        tf.debugging.assert_non_negative(parsed["label"], message="TFRecord label outside 0..9"),
    ]
    with tf.control_dependencies(checks):
        images = tf.io.decode_raw(parsed["image_raw"], tf.uint8, fixed_length=NUM_PIXELS)
        return tf.reshape(images, [-1, NUM_PIXELS]), tf.identity(parsed["label"])


def serialized_chunks(path: str) -> Iterator[tf.Tensor]:
    """A TFRecord file's serialized examples, PARSE_BATCH at a time, each record's CRCs checked.

    Read by TensorFlow's record reader itself rather than a tf.data pipeline: on a rank's one inter-op thread,
    tf.data's work per record took 0.6 s for Fashion-MNIST's 70,000, this 0.2 s (docs/benchmark.md).
    `inspect.unwrap` leaves out the deprecation notice that tf_record_iterator would print on every rank.
    """
    records = inspect.unwrap(tf.compat.v1.io.tf_record_iterator)(path)
    while chunk := list(itertools.islice(records, PARSE_BATCH)):
        yield tf.constant(chunk)


def check_record_files(paths: Sequence[str | Path]) -> list[str]:
    """Expand and verify the --train-records/--test-records arguments (files or glob patterns)."""
    files: list[str] = []
    for pattern in paths:
        matched = sorted(tf.io.gfile.glob(str(pattern)))
        if not matched:
            raise UserError(f"no TFRecord file matches {pattern}")
        if folders := [path for path in matched if tf.io.gfile.isdir(path)]:
            raise UserError(f"{folders[0]} is a directory, not a TFRecord file (give the files, or a glob of them)")
        files.extend(matched)
    return files


def describe_data_error(err: tf.errors.OpError) -> str:
    """The useful part of a tf.data error: our assertion's message, or the first line TensorFlow gives."""
    found = re.search(r"assertion failed: \[([^\]]*)\]", err.message)
    if found:
        return found.group(1)
    return first_line(err)


def read_records(files: Sequence[str | Path]) -> Split:
    """Read whole TFRecord files into memory, checking every record (CRCs, features, values).

    Done before training on every rank, so a damaged file stops all ranks at start-up with one clear
    line, instead of one rank failing mid-run while the others wait in an allreduce.
    """
    images, labels = [], []
    for path in files:
        try:
            for batch_images, batch_labels in map(parse_batch, serialized_chunks(str(path))):
                images.append(batch_images.numpy())
                labels.append(batch_labels.numpy())
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as err:
            raise UserError(f"bad TFRecord file {path}: {describe_data_error(err)}") from None
    if not labels:
        raise UserError(f"no examples in {', '.join(map(str, files))}")
    return Split(np.concatenate(images), np.concatenate(labels))
