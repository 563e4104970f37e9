"""Download the standard MNIST IDX files and check their SHA-256 (needs internet; tests never call it)."""

from __future__ import annotations

import hashlib
import urllib.request
from pathlib import Path

from hvd_mnist.errors import UserError

MNIST_MIRROR = "https://storage.googleapis.com/cvdf-datasets/mnist/"
MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_mnist(dest: str | Path, mirror: str = MNIST_MIRROR) -> Path:
    """Fetch the four MNIST files into dest (skipping verified ones) and verify every checksum."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, expected in MNIST_SHA256.items():
        target = dest / name
        if target.is_file() and sha256_of(target) == expected:
            continue
        partial = target.with_suffix(".part")
        try:
            urllib.request.urlretrieve(mirror + name, partial)
        except OSError as err:
            raise UserError(f"cannot download {mirror + name}: {err}") from None
        actual = sha256_of(partial)
        if actual != expected:
            partial.unlink()
            raise UserError(f"{name}: SHA-256 {actual} does not match the published {expected}")
        partial.replace(target)
    return dest
