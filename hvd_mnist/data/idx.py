"""Read and validate MNIST's IDX files (plain or gzip-compressed) with numpy alone."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from hvd_mnist.errors import UserError

IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions (count, rows, cols)
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension (count)
IMAGE_SIDE = 28
NUM_PIXELS = IMAGE_SIDE * IMAGE_SIDE
NUM_CLASSES = 10
SPLIT_PREFIX = {"train": "train", "test": "t10k"}


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except (OSError, EOFError) as err:
        raise UserError(f"cannot read IDX file {path}: {err}") from None


def read_idx(path: str | Path, expected_magic: int) -> np.ndarray:
    """Return the uint8 array stored in an IDX file, checking its magic number and size."""
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise UserError(f"{path}: too short to be an IDX file ({len(data)} bytes)")
    magic = int.from_bytes(data[:4], "big")
    if magic != expected_magic:
        raise UserError(f"{path}: wrong IDX magic number 0x{magic:08x}, expected 0x{expected_magic:08x}")
    ndim = magic & 0xFF
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise UserError(f"{path}: truncated IDX header")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header_size + int(np.prod(shape))
    if len(data) != expected:
        raise UserError(f"{path}: IDX header says shape {shape} ({expected} bytes) but the file has {len(data)}")
    return np.frombuffer(data, dtype=np.uint8, offset=header_size).reshape(shape)


def idx_paths(data_dir: str | Path, split: str) -> tuple[Path, Path]:
    """Find the images and labels files of a split ('train' or 't10k' names), gzipped or not."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise UserError(f"data directory {'is a file' if data_dir.exists() else 'not found'}: {data_dir}")
    prefix = SPLIT_PREFIX[split]
    found = []
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        candidates = [data_dir / f"{prefix}-{kind}{ext}" for ext in ("", ".gz")]
        existing = [path for path in candidates if path.is_file()]
        if not existing:
            raise UserError(f"missing MNIST file {candidates[0].name}[.gz] in {data_dir}")
        found.append(existing[0])
    return found[0], found[1]


def load_idx_split(data_dir: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Load one split as (images uint8 [N, 784], labels uint8 [N]) and validate it."""
    images_path, labels_path = idx_paths(data_dir, split)
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if images.shape[1:] != (IMAGE_SIDE, IMAGE_SIDE):
        raise UserError(f"{images_path}: images are {images.shape[1:]}, expected (28, 28)")
    if len(images) != len(labels):
        raise UserError(f"{images_path.name} has {len(images)} images but {labels_path.name} has {len(labels)} labels")
    if labels.size and labels.max() >= NUM_CLASSES:
        raise UserError(f"{labels_path}: label {int(labels.max())} is outside 0..9")
    return images.reshape(len(images), NUM_PIXELS), labels


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (gzip-compressed when the name ends in .gz)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = (0x0800 | array.ndim).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as handle:
        handle.write(header + array.tobytes())
