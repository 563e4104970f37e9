"""MNIST download and SHA-256 check, against a local file:// mirror (tests never touch the network)."""

import hashlib

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


def test_published_checksums_are_the_standard_ones():
    assert download.MNIST_SHA256["train-images-idx3-ubyte.gz"].startswith("440fcabf73cc546f")
    assert len(download.MNIST_SHA256) == 4
