"""MNIST download and SHA-256 check, against a local file:// mirror (tests never touch the network)."""

import hashlib
import re

import pytest

from hvd_mnist.data import download
from hvd_mnist.errors import UserError


@pytest.fixture
def mirror(tmp_path):
    """A directory holding a stand-in for each MNIST file, served as a file:// URL."""
    root = tmp_path / "mirror"
    root.mkdir()
    for name in download.MNIST_SHA256:
        (root / name).write_bytes(name.encode() * 10)
    return root


def test_verified_download(tmp_path, mirror, monkeypatch):
    digests = {name: hashlib.sha256((mirror / name).read_bytes()).hexdigest() for name in download.MNIST_SHA256}
    monkeypatch.setattr(download, "MNIST_SHA256", digests)
    dest = download.download_mnist(tmp_path / "dest", mirror=mirror.as_uri() + "/")
    assert sorted(p.name for p in dest.iterdir()) == sorted(digests)
    (mirror / next(iter(digests))).unlink()  # already verified files are not fetched again
    download.download_mnist(dest, mirror=mirror.as_uri() + "/")


def test_checksum_mismatch_is_rejected_and_nothing_kept(tmp_path, mirror):
    with pytest.raises(UserError, match="does not match the published"):
        download.download_mnist(tmp_path / "dest", mirror=mirror.as_uri() + "/")
    assert list((tmp_path / "dest").iterdir()) == []


def test_a_published_checksum_for_each_standard_file():
    """The four standard MNIST file names, each with its own well-formed SHA-256 digest (a truncated,
    upper-case, pasted-twice or missing digest would never match a download)."""
    assert set(download.MNIST_SHA256) == {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                          "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}
    digests = list(download.MNIST_SHA256.values())
    assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in digests), digests
    assert len(set(digests)) == 4, digests
