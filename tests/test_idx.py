"""IDX parsing: round trips and every kind of damaged file."""

import gzip

import numpy as np
import pytest

from hvd_mnist.data.idx import IMAGES_MAGIC, LABELS_MAGIC, load_idx_split, read_idx, write_idx
from hvd_mnist.errors import UserError


def write_split(directory, images, labels, prefix="train", gz=True):
    ext = ".gz" if gz else ""
    write_idx(directory / f"{prefix}-images-idx3-ubyte{ext}", images)
    write_idx(directory / f"{prefix}-labels-idx1-ubyte{ext}", labels)


@pytest.mark.parametrize("gz", [True, False])
def test_round_trip(tmp_path, gz):
    images = np.random.default_rng(0).integers(0, 256, size=(7, 28, 28), dtype=np.uint8)
    labels = np.array([0, 1, 2, 3, 4, 5, 9], dtype=np.uint8)
    write_split(tmp_path, images, labels, gz=gz)
    loaded_images, loaded_labels = load_idx_split(tmp_path, "train")
    assert loaded_images.shape == (7, 784)
    np.testing.assert_array_equal(loaded_images, images.reshape(7, 784))
    np.testing.assert_array_equal(loaded_labels, labels)


def test_header_is_the_standard_one(tmp_path):
    write_idx(tmp_path / "x", np.zeros((2, 28, 28), np.uint8))
    raw = (tmp_path / "x").read_bytes()
    assert raw[:16] == bytes.fromhex("00000803" "00000002" "0000001c" "0000001c")
    assert len(raw) == 16 + 2 * 784


def test_wrong_magic(tmp_path):
    write_idx(tmp_path / "labels", np.zeros(3, np.uint8))
    with pytest.raises(UserError, match="wrong IDX magic number 0x00000801, expected 0x00000803"):
        read_idx(tmp_path / "labels", IMAGES_MAGIC)


def test_truncated_file(tmp_path):
    path = tmp_path / "images.gz"
    write_idx(path, np.zeros((3, 28, 28), np.uint8))
    data = gzip.decompress(path.read_bytes())[:-10]
    path.write_bytes(gzip.compress(data))
    with pytest.raises(UserError, match="header says shape"):
        read_idx(path, IMAGES_MAGIC)


def test_truncated_gzip_stream(tmp_path):
    path = tmp_path / "images.gz"
    write_idx(path, np.zeros((30, 28, 28), np.uint8))
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(UserError, match="cannot read IDX file"):
        read_idx(path, IMAGES_MAGIC)


def test_count_mismatch(tmp_path):
    write_split(tmp_path, np.zeros((4, 28, 28), np.uint8), np.zeros(3, np.uint8))
    with pytest.raises(UserError, match="4 images but .* 3 labels"):
        load_idx_split(tmp_path, "train")


def test_wrong_image_shape(tmp_path):
    write_split(tmp_path, np.zeros((2, 32, 32), np.uint8), np.zeros(2, np.uint8))
    with pytest.raises(UserError, match="expected \\(28, 28\\)"):
        load_idx_split(tmp_path, "train")


def test_label_out_of_range(tmp_path):
    write_split(tmp_path, np.zeros((2, 28, 28), np.uint8), np.array([3, 10], np.uint8))
    with pytest.raises(UserError, match="label 10 is outside 0..9"):
        load_idx_split(tmp_path, "train")


def test_missing_files_and_dir(tmp_path):
    with pytest.raises(UserError, match="missing MNIST file t10k-images-idx3-ubyte"):
        load_idx_split(tmp_path, "test")
    with pytest.raises(UserError, match="data directory not found"):
        load_idx_split(tmp_path / "nope", "train")


def test_labels_magic_accepted(tmp_path):
    write_idx(tmp_path / "l", np.arange(5, dtype=np.uint8))
    np.testing.assert_array_equal(read_idx(tmp_path / "l", LABELS_MAGIC), np.arange(5))
